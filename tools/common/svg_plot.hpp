// SPDX-License-Identifier: Apache-2.0
// memdecay tools: grouped bar charts as SVG (memdecay-eval's and memdecay-replay's --plot). A chart is rows of
// panels; a panel has groups (budgets) of bars (one per series: policy or config), optional whiskers, a line per
// group (the oracle) and a line across the panel (the full cache). No third-party code: the SVG is written here.
#ifndef MEMDECAY_TOOLS_COMMON_SVG_PLOT_HPP
#define MEMDECAY_TOOLS_COMMON_SVG_PLOT_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xml_escape.hpp"

namespace memdecay_tools::svg {

/// One bar: its value (in the panel's units, 0..top), its tooltip and an optional interval (a whisker).
struct bar {
  double value = 0;
  std::string title;
  std::optional<std::pair<double, double>> interval;
};

/// A horizontal marker: its value and tooltip.
struct marker {
  double value = 0;
  std::string title;
};

struct panel {
  std::string title;
  double top = 1.0;                                   ///< the value at the top of the axis (ticks are 5ths of it)
  std::vector<std::string> groups;                    ///< one label per group, under the axis
  std::vector<std::vector<std::optional<bar>>> bars;  ///< [group][series]; empty = no bar
  std::vector<std::optional<marker>> group_markers;   ///< [group]: red dotted across the group (the oracle)
  std::optional<marker> panel_marker;                 ///< dashed across the panel (the full cache)
};

struct chart {
  std::string title;
  std::vector<std::string> series;       ///< the legend: one colour per series
  std::vector<std::vector<panel>> rows;  ///< rows of panels, left to right
  double panel_width = 520;
  double panel_height = 200;
  double bar_share = 0.85;  ///< of a group's width, what its bars take
  std::size_t legend_columns = 4;
  double legend_column_width = 230;
};

/// "12%" for 0.12.
[[nodiscard]] inline std::string percent_label(double v) {
  std::ostringstream s;
  const double p = v * 100.0;
  if (std::abs(p - std::round(p)) < 1e-9)
    s << std::lround(p);
  else
    s << std::round(p * 10.0) / 10.0;
  s << "%";
  return s.str();
}

[[nodiscard]] inline std::string render(const chart& c) {
  static const char* palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939",
                                  "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
                                  "#756bb1", "#636363", "#9c9ede", "#cedb9c", "#e7cb94", "#e7969c"};
  const double margin_l = 60, margin_t = 50, gap = 70;
  const double pw = c.panel_width, ph = c.panel_height;
  std::size_t columns = 0;
  for (const auto& r : c.rows) columns = std::max(columns, r.size());
  const std::size_t legend_rows = (c.series.size() + c.legend_columns - 1) / std::max<std::size_t>(1, c.legend_columns);
  const double legend_h = 22.0 * static_cast<double>(legend_rows) + 20;
  const double width = std::max(margin_l + static_cast<double>(columns) * (pw + gap),
                                margin_l + static_cast<double>(c.legend_columns) * c.legend_column_width);
  const double height = margin_t + static_cast<double>(c.rows.size()) * (ph + gap) + legend_h;
  auto colour = [&](std::size_t k) { return palette[k % std::size(palette)]; };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" << xml_escape(c.title)
    << "</text>\n";
  for (std::size_t row = 0; row < c.rows.size(); ++row)
    for (std::size_t col = 0; col < c.rows[row].size(); ++col) {
      const panel& p = c.rows[row][col];
      const double x0 = margin_l + static_cast<double>(col) * (pw + gap);
      const double y0 = margin_t + static_cast<double>(row) * (ph + gap);
      const double top = p.top > 0 ? p.top : 1.0;
      auto y_of = [&](double v) { return y0 + ph - ph * std::clamp(v / top, 0.0, 1.0); };
      s << "<text x=\"" << x0 + pw / 2 << "\" y=\"" << y0 - 8 << "\" text-anchor=\"middle\" font-size=\"13\">"
        << xml_escape(p.title) << "</text>\n";
      for (int k = 0; k <= 5; ++k) {
        const double y = y0 + ph - ph * k / 5.0;
        s << "<line x1=\"" << x0 << "\" y1=\"" << y << "\" x2=\"" << x0 + pw << "\" y2=\"" << y
          << "\" stroke=\"#ddd\"/>\n<text x=\"" << x0 - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">"
          << percent_label(top * k / 5.0) << "</text>\n";
      }
      const double group_w = pw / static_cast<double>(std::max<std::size_t>(1, p.groups.size()));
      const double bar_w = group_w * c.bar_share / static_cast<double>(std::max<std::size_t>(1, c.series.size()));
      for (std::size_t g = 0; g < p.groups.size(); ++g) {
        const double gx = x0 + static_cast<double>(g) * group_w + group_w * (1 - c.bar_share) / 2;
        s << "<text x=\"" << x0 + (static_cast<double>(g) + 0.5) * group_w << "\" y=\"" << y0 + ph + 16
          << "\" text-anchor=\"middle\">" << xml_escape(p.groups[g]) << "</text>\n";
        for (std::size_t k = 0; g < p.bars.size() && k < p.bars[g].size(); ++k) {
          if (!p.bars[g][k]) continue;
          const bar& b = *p.bars[g][k];
          const double y = y_of(b.value);
          s << "<rect x=\"" << gx + static_cast<double>(k) * bar_w << "\" y=\"" << y << "\" width=\"" << bar_w * 0.9
            << "\" height=\"" << y0 + ph - y << "\" fill=\"" << colour(k) << "\"><title>" << xml_escape(b.title)
            << "</title></rect>\n";
          if (b.interval) {
            const double cx = gx + (static_cast<double>(k) + 0.45) * bar_w;
            const double ylo = y_of(b.interval->first), yhi = y_of(b.interval->second);
            s << "<line x1=\"" << cx << "\" y1=\"" << ylo << "\" x2=\"" << cx << "\" y2=\"" << yhi
              << "\" stroke=\"black\" stroke-width=\"1\"/>\n<line x1=\"" << cx - 2 << "\" y1=\"" << ylo << "\" x2=\""
              << cx + 2 << "\" y2=\"" << ylo << "\" stroke=\"black\"/>\n<line x1=\"" << cx - 2 << "\" y1=\"" << yhi
              << "\" x2=\"" << cx + 2 << "\" y2=\"" << yhi << "\" stroke=\"black\"/>\n";
          }
        }
        if (g < p.group_markers.size() && p.group_markers[g]) {
          const double y = y_of(p.group_markers[g]->value);
          s << "<line x1=\"" << gx << "\" y1=\"" << y << "\" x2=\"" << gx + group_w * c.bar_share << "\" y2=\"" << y
            << "\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"2,3\"><title>"
            << xml_escape(p.group_markers[g]->title) << "</title></line>\n";
        }
      }
      if (p.panel_marker) {
        const double y = y_of(p.panel_marker->value);
        s << "<line x1=\"" << x0 << "\" y1=\"" << y << "\" x2=\"" << x0 + pw << "\" y2=\"" << y
          << "\" stroke=\"black\" stroke-dasharray=\"6,4\"><title>" << xml_escape(p.panel_marker->title)
          << "</title></line>\n";
      }
      s << "<line x1=\"" << x0 << "\" y1=\"" << y0 + ph << "\" x2=\"" << x0 + pw << "\" y2=\"" << y0 + ph
        << "\" stroke=\"black\"/>\n<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0 << "\" y2=\"" << y0 + ph
        << "\" stroke=\"black\"/>\n";
    }
  const double ly = margin_t + static_cast<double>(c.rows.size()) * (ph + gap) - 20;
  for (std::size_t k = 0; k < c.series.size(); ++k) {
    const double lx = margin_l + static_cast<double>(k % c.legend_columns) * c.legend_column_width;
    const double y = ly + 22.0 * static_cast<double>(k / c.legend_columns);
    s << "<rect x=\"" << lx << "\" y=\"" << y - 10 << "\" width=\"14\" height=\"14\" fill=\"" << colour(k)
      << "\"/><text x=\"" << lx + 20 << "\" y=\"" << y + 2 << "\">" << xml_escape(c.series[k]) << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

/// Writes render(c) to `path`; std::runtime_error when the file cannot be written.
inline void write(const std::string& path, const chart& c) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("--plot: cannot create '" + path + "'");
  out << render(c);
  if (!out) throw std::runtime_error("--plot: cannot write '" + path + "'");
}

}  // namespace memdecay_tools::svg

#endif  // MEMDECAY_TOOLS_COMMON_SVG_PLOT_HPP
