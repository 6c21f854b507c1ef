// A small SVG line-chart writer for accelpool-sim's plots: axes with ticks (linear or log10), one polyline
// per series, a legend. Output depends only on the data (no timestamps), so equal runs give equal files.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

namespace accelpool::sim::detail {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in the given order
  bool step = false;                              // draw as a step function (hold y until the next x)
  // Optional shaded band around the line, e.g. a confidence interval: (x, low, high), drawn in the given order
  // in the series' colour, translucent.
  std::vector<std::array<double, 3>> band;
};

struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_x = false;    // points with x <= 0 are clamped to the smallest positive x
  bool fixed_y = false;  // y axis ends exactly at the largest y (e.g. 1 for a CDF)
  std::vector<Series> series;
};

// The SVG document of a chart.
std::string render_svg(const Chart& chart);

}  // namespace accelpool::sim::detail
