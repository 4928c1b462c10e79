// Line charts as inline SVG for the run report: one polyline per series over
// the steps, axes with a few round tick labels, a legend. A series of more
// points than a chart can show is decimated first (decimate).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::report {

struct Point {
  double x = 0, y = 0;
};

struct Series {
  std::string name;
  std::vector<Point> points;  // in x order; non-finite y values are not drawn
  bool markers = false;       // a dot at each point (sparse series: validation)
  bool dashed = false;
};

struct Chart {
  std::string title;  // the report shows it above the chart
  std::string y_label;
  std::vector<Series> series;
  bool y_from_zero = false;  // the y axis starts at 0 (amounts: memory, time, throughput)
};

// Text made safe inside HTML and SVG elements and attribute values.
std::string escape_html(std::string_view text);

// A number as a tick label or table cell: `digits` significant digits,
// thousands as k, M or G ("1.25k", "0.001", "3.2e-05").
std::string format_number(double value, int digits = 4);

// At most `max_points` of `points` (at least 4), drawing the same envelope:
// consecutive points are grouped into max_points / 2 buckets and each bucket
// keeps its lowest and highest point, in x order; the first and last points
// are always kept. Fewer points are returned as they are.
std::vector<Point> decimate(const std::vector<Point>& points, size_t max_points);

// The most points a series keeps (decimate) in render_svg.
constexpr size_t kMaxChartPoints = 1200;

// The chart as an <svg> element (its title is not in it: the page shows it).
std::string render_svg(const Chart& chart);

}  // namespace meshtrain::report
