// TensorBoard event files (tensorboard.h): TFRecord framing, CRC32C and the Event protobufs.
#include "cohort/core/tensorboard.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <chrono>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort {
namespace {

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrc32cTable = make_crc32c_table();

// Protobuf wire format, the few pieces an Event needs.
enum WireType : std::uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, std::uint32_t field, WireType type) {
  put_varint(out, (std::uint64_t{field} << 3) | type);
}

template <typename U>
void put_le(std::string& out, U v) {
  static_assert(std::is_unsigned_v<U>);
  for (std::size_t i = 0; i < sizeof(U); ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event.wall_time = 1 (double).
std::string event_with_wall_time(double wall_time) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_le(e, std::bit_cast<std::uint64_t>(wall_time));
  return e;
}

std::string event_file_name() {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  host[sizeof host - 1] = '\0';
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return "events.out.tfevents." +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) + "." +
         host + "." + std::to_string(getpid());
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint32_t crc32c(std::string_view data) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (const char ch : data)
    c = kCrc32cTable[(c ^ static_cast<std::uint8_t>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string r;
  r.reserve(data.size() + 16);
  put_le(r, std::uint64_t{data.size()});
  put_le(r, masked_crc32c(r));  // of the 8 length bytes
  r.append(data);
  put_le(r, masked_crc32c(data));
  return r;
}

std::string encode_version_event(double wall_time) {
  std::string e = event_with_wall_time(wall_time);
  put_bytes(e, 3, "brain.Event:2");  // Event.file_version
  return e;
}

std::string encode_scalar_event(double wall_time, std::int64_t step, std::string_view tag,
                                float value) {
  std::string v;  // Summary.Value
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);  // simple_value
  put_le(v, std::bit_cast<std::uint32_t>(value));
  std::string summary;
  put_bytes(summary, 1, v);  // Summary.value (repeated, one here)
  std::string e = event_with_wall_time(wall_time);
  put_key(e, 2, kVarint);  // Event.step: int64, negatives as their two's complement
  put_varint(e, static_cast<std::uint64_t>(step));
  put_bytes(e, 5, summary);  // Event.summary
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw ConfigError("cannot create the TensorBoard folder " + dir.string() +
                      (ec ? ": " + ec.message() : std::string()));
  }
  const std::string base = event_file_name();
  path_ = dir / base;
  for (int i = 1; std::filesystem::exists(path_) && i < 1000; ++i)
    path_ = dir / (base + "." + std::to_string(i));
  out_.open(path_, std::ios::out | std::ios::binary | std::ios::trunc);
  if (!out_) throw ConfigError("cannot write the TensorBoard event file " + path_.string());
  out_ << tfrecord(encode_version_event(unix_seconds()));
  if (!flush()) throw ConfigError("cannot write the TensorBoard event file " + path_.string());
}

void TensorBoardWriter::scalar(std::string_view tag, std::int64_t step, float value,
                               double wall_time) {
  out_ << tfrecord(encode_scalar_event(wall_time, step, tag, value));
}

bool TensorBoardWriter::flush() {
  out_.flush();
  return static_cast<bool>(out_);
}

TensorBoardScalars::TensorBoardScalars(const std::filesystem::path& dir,
                                       std::vector<ScalarEvent> events)
    : writer_(dir), events_(std::move(events)) {}

void TensorBoardScalars::attach(MetricsSink& sink) {
  sink.observe([this](std::string_view event, const std::vector<MetricField>& fields) {
    record(event, fields);
  });
}

void TensorBoardScalars::record(std::string_view event, const std::vector<MetricField>& fields) {
  if (failed_) return;
  for (const auto& e : events_) {
    if (e.event != event) continue;
    const MetricValue* step_value = find_field(fields, e.step_field);
    const auto step = step_value ? numeric(*step_value) : std::nullopt;
    if (!step) return;
    const double now = unix_seconds();
    for (const auto& t : e.tags) {
      const MetricValue* v = find_field(fields, t.field);
      if (const auto x = v ? numeric(*v) : std::nullopt) {
        writer_.scalar(t.tag, static_cast<std::int64_t>(*step), static_cast<float>(*x), now);
      }
    }
    if (!writer_.flush()) {
      failed_ = true;
      COHORT_LOG(Warn) << "cannot write the TensorBoard event file " << writer_.path().string()
                       << "; no more scalars are written to it";
    }
    return;
  }
}

}  // namespace cohort
