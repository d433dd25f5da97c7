// cohort-sim --plot: accuracy and loss against rounds and simulated time, drawn by gnuplot from
// the simulator's CSV (sim.csv_file).
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "cohort/core/error.h"
#include "cohort/sim/sim.h"

namespace cohort::sim {

void plot(const std::filesystem::path& csv, const std::filesystem::path& png) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    throw ConfigError(
        "--plot needs gnuplot, which is not installed (Debian: apt-get install gnuplot-nox)");
  }
  if (!std::filesystem::exists(csv))
    throw DataError("--plot: no metrics CSV at " + csv.string() + " (sim.csv_file)");
  // Simulated time in the unit that suits the run's length (column 15: sim_seconds); whether any
  // row has an accuracy (column 11; none with train.loss = mse: then only the losses are drawn).
  double last_sim_s = 0;
  bool accuracy = false;
  {
    std::ifstream in(csv);
    std::string line;
    for (bool header = true; std::getline(in, line); header = false) {
      if (line.empty() || header) continue;
      std::stringstream cells(line);
      std::string cell;
      for (int col = 1; std::getline(cells, cell, ','); ++col) {
        if (col == 11 && !cell.empty()) accuracy = true;
        if (col == 15) last_sim_s = std::strtod(cell.c_str(), nullptr);
      }
    }
  }
  const char* unit = last_sim_s >= 7200 ? "h" : last_sim_s >= 120 ? "min" : "s";
  const double div = last_sim_s >= 7200 ? 3600 : last_sim_s >= 120 ? 60 : 1;
  const std::string t = "($15/" + std::to_string(div) + ")";
  const auto script = std::filesystem::path(png.string() + ".gp");
  {
    std::ofstream out(script);
    out << "set terminal pngcairo size 1200,800 noenhanced\n"
        << "set output '" << png.string() << "'\n"
        << "set datafile separator ','\n"
        << "set key autotitle columnhead\n"
        << "set grid\n"
        << "set multiplot layout " << (accuracy ? "2,2" : "1,2")
        << " title 'cohort-sim: " << csv.filename().string() << "'\n"
        << "set xlabel 'round'\n";
    if (accuracy) {
      out << "set ylabel 'test accuracy'\nset key bottom right\n"
          << "plot '" << csv.string() << "' using 1:11 with linespoints title 'accuracy'\n";
    }
    out << "set ylabel 'loss'\nset key top right\n"
        << "plot '" << csv.string()
        << "' using 1:9 with lines title 'train loss', '' using 1:10 with linespoints title 'test "
           "loss'\n"
        << "set xlabel 'simulated time (" << unit << ")'\n";
    if (accuracy) {
      out << "set ylabel 'test accuracy'\nset key bottom right\n"
          << "plot '" << csv.string() << "' using " << t
          << ":11 with linespoints title 'accuracy'\n";
    }
    out << "set ylabel 'loss'\nset key top right\n"
        << "plot '" << csv.string() << "' using " << t
        << ":9 with lines title 'train loss', '' using " << t
        << ":10 with linespoints title 'test loss'\n"
        << "unset multiplot\n";
  }
  const std::string cmd = "gnuplot '" + script.string() + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) throw DataError("gnuplot failed on " + script.string());
  std::filesystem::remove(script);
}

}  // namespace cohort::sim
