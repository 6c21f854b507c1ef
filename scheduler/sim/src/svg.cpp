#include "svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace accelpool::sim::detail {

namespace {

constexpr double kWidth = 900, kHeight = 540;
constexpr double kLeft = 80, kRight = 200, kTop = 50, kBottom = 60;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// "250", "0.5", or "2e6" for large and tiny values.
std::string label(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-2)) {
    const int exp = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
    const double mant = v / std::pow(10, exp);
    std::snprintf(buf, sizeof buf, "%ge%d", std::round(mant * 100) / 100, exp);
  } else {
    std::snprintf(buf, sizeof buf, "%g", v);
  }
  return buf;
}

// Ticks at 1, 2 or 5 x 10^k covering [lo, hi].
std::vector<double> linear_ticks(double lo, double hi) {
  const double span = hi - lo;
  const double raw = span / 6;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

}  // namespace

std::string render_svg(const Chart& chart) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = 0, ymax = -xmin;
  double min_pos = std::numeric_limits<double>::infinity();
  for (const auto& s : chart.series) {
    for (auto [x, y] : s.points) {
      if (x > 0) min_pos = std::min(min_pos, x);
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, y);
      ymin = std::min(ymin, y);
    }
    for (const auto& [x, lo, hi] : s.band) {
      ymax = std::max(ymax, hi);
      ymin = std::min(ymin, lo);
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1, ymax = 1;
  if (ymax <= ymin) ymax = ymin + 1;
  if (!chart.fixed_y) ymax += (ymax - ymin) * 0.05;  // headroom so peaks do not touch the frame
  double lx0 = 0, lx1 = 1;                           // log10 range
  if (chart.log_x) {
    if (!std::isfinite(min_pos)) min_pos = 1;
    lx0 = std::floor(std::log10(min_pos));
    lx1 = std::ceil(std::log10(std::max(xmax, min_pos)));
    if (lx1 <= lx0) lx1 = lx0 + 1;
  } else if (xmax <= xmin) {
    xmax = xmin + 1;
  }
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) {
    if (chart.log_x) return kLeft + (std::log10(std::max(x, min_pos)) - lx0) / (lx1 - lx0) * pw;
    return kLeft + (x - xmin) / (xmax - xmin) * pw;
  };
  auto py = [&](double y) { return kTop + ph - (y - ymin) / (ymax - ymin) * ph; };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << kWidth / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << esc(chart.title)
    << "</text>\n";
  // Grid, ticks and labels.
  std::vector<double> xt;
  if (chart.log_x) {
    for (double e = lx0; e <= lx1; e += 1) xt.push_back(std::pow(10, e));
  } else {
    xt = linear_ticks(xmin, xmax);
  }
  for (double v : xt) {
    const double x = px(v);
    o << "<line x1=\"" << num(x) << "\" y1=\"" << kTop << "\" x2=\"" << num(x) << "\" y2=\"" << kTop + ph
      << "\" stroke=\"#e0e0e0\"/>\n";
    o << "<text x=\"" << num(x) << "\" y=\"" << kTop + ph + 18 << "\" text-anchor=\"middle\">" << label(v)
      << "</text>\n";
  }
  for (double v : linear_ticks(ymin, ymax)) {
    const double y = py(v);
    o << "<line x1=\"" << kLeft << "\" y1=\"" << num(y) << "\" x2=\"" << kLeft + pw << "\" y2=\"" << num(y)
      << "\" stroke=\"#e0e0e0\"/>\n";
    o << "<text x=\"" << kLeft - 6 << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">" << label(v) << "</text>\n";
  }
  o << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  o << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kHeight - 18 << "\" text-anchor=\"middle\">" << esc(chart.x_label)
    << "</text>\n";
  o << "<text transform=\"translate(20," << kTop + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << esc(chart.y_label) << "</text>\n";
  // Series and legend.
  for (std::size_t i = 0; i < chart.series.size(); ++i) {
    const auto& s = chart.series[i];
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    if (!s.band.empty()) {
      o << "<polygon fill=\"" << color << "\" fill-opacity=\"0.18\" stroke=\"none\" points=\"";
      for (const auto& [x, lo, hi] : s.band) o << num(px(x)) << ',' << num(py(hi)) << ' ';
      for (auto it = s.band.rbegin(); it != s.band.rend(); ++it)
        o << num(px((*it)[0])) << ',' << num(py((*it)[1])) << ' ';
      o << "\"/>\n";
    }
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (std::size_t k = 0; k < s.points.size(); ++k) {
      const auto [x, y] = s.points[k];
      if (s.step && k > 0) o << num(px(x)) << ',' << num(py(s.points[k - 1].second)) << ' ';
      o << num(px(x)) << ',' << num(py(y)) << ' ';
    }
    o << "\"/>\n";
    const double ly = kTop + 10 + 20 * static_cast<double>(i);
    o << "<line x1=\"" << kLeft + pw + 12 << "\" y1=\"" << ly << "\" x2=\"" << kLeft + pw + 36 << "\" y2=\"" << ly
      << "\" stroke=\"" << color << "\" stroke-width=\"3\"/>\n";
    o << "<text x=\"" << kLeft + pw + 42 << "\" y=\"" << ly + 4 << "\">" << esc(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace accelpool::sim::detail
