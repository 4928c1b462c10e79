#include "report/chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace meshtrain::report {

namespace {

// The drawing's size and the plot area inside it, in SVG units.
constexpr double kWidth = 560, kHeight = 260, kLeft = 62, kRight = 12, kTop = 28, kBottom = 34;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};

struct Range {
  double lo = 0, hi = 0;
};

// Round tick values covering `r` (about `count`), and r widened to the outer
// ones. A range too narrow for its magnitude (or empty) is widened first.
std::vector<double> ticks(Range& r, int count) {
  const double scale = std::max(std::abs(r.lo), std::abs(r.hi));
  if (!(r.hi - r.lo > scale * 1e-9)) {
    const double pad = scale == 0 ? 1 : scale * 0.1;
    r = {r.lo - pad, r.hi + pad};
  }
  const double raw = (r.hi - r.lo) / count, magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude * 10;
  for (const double m : {1.0, 2.0, 2.5, 5.0})
    if (raw <= m * magnitude) {
      step = m * magnitude;
      break;
    }
  r = {std::floor(r.lo / step) * step, std::ceil(r.hi / step) * step};
  std::vector<double> out;
  const int64_t n = std::min<int64_t>(std::llround((r.hi - r.lo) / step), 4 * count);  // counted, never accumulated
  for (int64_t i = 0; i <= n; ++i) {
    const double t = r.lo + static_cast<double>(i) * step;
    out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return out;
}

// The finite points' ranges in x and y; false when there is none.
bool data_range(const Chart& chart, Range& x, Range& y) {
  bool any = false;
  for (const Series& s : chart.series)
    for (const Point& p : s.points) {
      if (!std::isfinite(p.y) || !std::isfinite(p.x)) continue;
      x = any ? Range{std::min(x.lo, p.x), std::max(x.hi, p.x)} : Range{p.x, p.x};
      y = any ? Range{std::min(y.lo, p.y), std::max(y.hi, p.y)} : Range{p.y, p.y};
      any = true;
    }
  return any;
}

struct Frame {
  Range x, y;
  double px(double v) const { return kLeft + (v - x.lo) / (x.hi - x.lo) * (kWidth - kLeft - kRight); }
  double py(double v) const { return kHeight - kBottom - (v - y.lo) / (y.hi - y.lo) * (kHeight - kTop - kBottom); }
};

// Significant digits that tell the ticks apart (at least 4).
int tick_digits(const std::vector<double>& t) {
  if (t.size() < 2) return 4;
  const double largest = std::max(std::abs(t.front()), std::abs(t.back())), step = t[1] - t[0];
  return std::max(4, static_cast<int>(std::floor(std::log10(largest)) - std::floor(std::log10(step))) + 2);
}

std::string axes(const Frame& f, const std::vector<double>& xt, const std::vector<double>& yt,
                 const std::string& y_label) {
  std::string out;
  const int digits = tick_digits(yt);
  for (const double t : yt)
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" class=\"grid\"/>"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        kLeft, f.py(t), kWidth - kRight, kLeft - 4, f.py(t) + 4, escape_html(format_number(t, digits)));
  for (const double t : xt)
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" class=\"grid\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
        f.px(t), kTop, kHeight - kBottom, kHeight - kBottom + 14, escape_html(format_number(t)));
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n",
                     (kLeft + kWidth - kRight) / 2, kHeight - 4);
  out += fmt::format("<text x=\"4\" y=\"14\">{}</text>\n", escape_html(y_label));
  return out;
}

// The series' finite points as runs between non-finite ones, each a polyline.
std::string series_svg(const Series& s, const Frame& f, const char* color) {
  const std::vector<Point> kept = decimate(s.points, kMaxChartPoints);
  std::string out, path;
  auto flush = [&] {
    if (!path.empty())
      out += fmt::format("<polyline points=\"{}\" stroke=\"{}\"{}/>\n", path, color,
                         s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    path.clear();
  };
  for (const Point& p : kept) {
    if (!std::isfinite(p.y)) {
      flush();
      continue;
    }
    path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", f.px(p.x), f.py(p.y));
    if (s.markers)
      out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>", f.px(p.x), f.py(p.y), color);
  }
  flush();
  return out;
}

std::string legend(const Chart& chart) {
  std::string out;
  double x = kLeft + 90;  // right of the y label
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"12\" x2=\"{1:.1f}\" y2=\"12\" stroke=\"{2}\" stroke-width=\"3\"/>"
        "<text x=\"{3:.1f}\" y=\"16\">{4}</text>\n",
        x, x + 16, color, x + 20, escape_html(chart.series[i].name));
    x += 34 + 6.5 * static_cast<double>(chart.series[i].name.size());
  }
  return out;
}

}  // namespace

std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  return out;
}

std::string format_number(double v, int digits) {
  if (!std::isfinite(v)) return fmt::format("{}", v);
  const double a = std::abs(v);
  if (a >= 1e9) return fmt::format("{:.{}g}G", v / 1e9, digits);
  if (a >= 1e6) return fmt::format("{:.{}g}M", v / 1e6, digits);
  if (a >= 1e4) return fmt::format("{:.{}g}k", v / 1e3, digits);
  return fmt::format("{:.{}g}", v, digits);
}

std::vector<Point> decimate(const std::vector<Point>& points, size_t max_points) {
  MT_ASSERT(max_points >= 4, "decimate to {} points", max_points);
  if (points.size() <= max_points) return points;
  const size_t buckets = (max_points - 2) / 2, inner = points.size() - 2;
  std::vector<Point> out{points.front()};
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = 1 + b * inner / buckets, end = 1 + (b + 1) * inner / buckets;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; ++i) {
      // NaN compares false: a bucket of NaN only keeps its first point, a gap in the line.
      if (points[i].y < points[lo].y || !std::isfinite(points[lo].y)) lo = i;
      if (points[i].y > points[hi].y || !std::isfinite(points[hi].y)) hi = i;
    }
    out.push_back(points[std::min(lo, hi)]);
    if (lo != hi) out.push_back(points[std::max(lo, hi)]);
  }
  out.push_back(points.back());
  return out;
}

std::string render_svg(const Chart& chart) {
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" "
      "role=\"img\" aria-label=\"{2}\">\n",
      kWidth, kHeight, escape_html(chart.title));
  Frame f;
  if (!data_range(chart, f.x, f.y)) {
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">no values logged</text>\n</svg>\n",
                       kWidth / 2, kHeight / 2);
    return out;
  }
  // Values whose range overflows a double (1e308 and -1e308) are not drawn.
  if (!std::isfinite(f.y.hi - f.y.lo) || !std::isfinite(f.x.hi - f.x.lo) || f.x.hi > 1e15)
    return out + fmt::format(
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">values too large to draw</text>\n</svg>\n",
                     kWidth / 2, kHeight / 2);
  f.x.hi = std::max(f.x.hi, f.x.lo + 4);  // steps: ticks at whole numbers
  if (chart.y_from_zero) f.y = {std::min(f.y.lo, 0.0), std::max(f.y.hi, 0.0)};
  const std::vector<double> yt = ticks(f.y, 5), xt = ticks(f.x, 6);
  out += axes(f, xt, yt, chart.y_label);
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", kLeft, kTop,
                     kWidth - kLeft - kRight, kHeight - kTop - kBottom);
  for (size_t i = 0; i < chart.series.size(); ++i)
    out += series_svg(chart.series[i], f, kColors[i % std::size(kColors)]);
  out += legend(chart);
  return out + "</svg>\n";
}

}  // namespace meshtrain::report
