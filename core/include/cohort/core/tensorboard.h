// TensorBoard event files: a metrics sink's per-round records as TensorBoard scalars, written in
// TensorBoard's own file format (docs/OBSERVABILITY.md, "TensorBoard event files").
//
// An event file is a sequence of TFRecords (length, masked CRC32C of the length, data, masked
// CRC32C of the data), each holding one serialized tensorflow.Event protobuf. The protobufs are
// encoded here by hand: a scalar needs three messages (Event, Summary, Summary.Value) and six
// fields between them, a few dozen lines, where protoc would add a code generator, a .proto and
// libprotobuf to the build of core (and to every library above it) for them. The encoding only
// writes, so no parser is exposed to untrusted input. CRC32C (Castagnoli) has no library in
// Debian 12 that the build already pulls in, so a table-driven one is here too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/metrics.h"

namespace cohort {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`.
std::uint32_t crc32c(std::string_view data);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length (little-endian), masked CRC32C of those 8 bytes, `data`, masked
// CRC32C of `data`.
std::string tfrecord(std::string_view data);

// The serialized Event protobufs an event file holds: the first, Event{wall_time, file_version =
// "brain.Event:2"}, and one scalar, Event{wall_time, step, summary{value{tag, simple_value}}}.
std::string encode_version_event(double wall_time);
std::string encode_scalar_event(double wall_time, std::int64_t step, std::string_view tag,
                                float value);

// Appends scalars to one new event file. Not thread-safe.
class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and in it events.out.tfevents.<unix-seconds>.<host>.<pid>
  // (".N" appended while that name is taken), whose first record is the file version. Throws
  // ConfigError naming the path if either cannot be made or written.
  explicit TensorBoardWriter(const std::filesystem::path& dir);

  // Appends one scalar; `wall_time` is Unix time in seconds. Buffered until flush().
  void scalar(std::string_view tag, std::int64_t step, float value, double wall_time);
  // Writes the buffered records out. Returns false once a write has failed (disk full, ...).
  bool flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

// Which numeric field of a metrics record becomes which scalar tag.
struct ScalarTag {
  std::string field;  // e.g. "test_accuracy"
  std::string tag;    // e.g. "test/accuracy"
};

// The records of one event that become scalars: the step is the record's `step_field`, and each
// of `tags` whose field the record has (bool, integer or double) is written.
struct ScalarEvent {
  std::string event;  // e.g. "round"
  std::string step_field = "round";
  std::vector<ScalarTag> tags;
};

// A metrics sink's observer that writes the records of `events` to a TensorBoardWriter, one
// flush per record (a round's scalars are in the file when its JSON line is). Records of other
// events, and records without the step field, are skipped. Not thread-safe: a sink calls its
// observers under its lock.
class TensorBoardScalars {
 public:
  // Throws ConfigError as TensorBoardWriter does.
  TensorBoardScalars(const std::filesystem::path& dir, std::vector<ScalarEvent> events);
  TensorBoardScalars(const TensorBoardScalars&) = delete;  // attach() hands out `this`
  TensorBoardScalars& operator=(const TensorBoardScalars&) = delete;

  // Makes `sink` pass its records to record(). `*this` must outlive the sink's last write.
  void attach(MetricsSink& sink);
  void record(std::string_view event, const std::vector<MetricField>& fields);

  const std::filesystem::path& path() const { return writer_.path(); }

 private:
  TensorBoardWriter writer_;
  std::vector<ScalarEvent> events_;
  bool failed_ = false;  // a write failed (logged once); no more are tried
};

}  // namespace cohort
