// Package svgchart draws the project's charts (the benchmarks' in
// cmd/dqbench, the scrape's in examples/observability) as small standalone
// SVG files: line charts, with no dependency.
package svgchart

import (
	"fmt"
	"math"
	"os"
	"strings"
)

// Colors are the series' colours, in the order the charts use them.
var Colors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"}

// Series is one line of a chart: points (x, y) in data units.
type Series struct {
	Name   string
	Color  string
	Points [][2]float64
}

// Chart is a line chart. With LogX the x axis is logarithmic, its ticks at
// powers of ten.
type Chart struct {
	Title, XLabel, YLabel string
	LogX                  bool
	Series                []Series
}

const (
	svgW, svgH                     = 720, 420
	padL, padR, padT, padB float64 = 70, 170, 40, 55
)

// Write writes the chart to path as an SVG file.
func (c Chart) Write(path string) error {
	return os.WriteFile(path, c.SVG(), 0o644)
}

// SVG returns the chart as an SVG document.
func (c Chart) SVG() []byte {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), 0.0, math.Inf(-1)
	for _, s := range c.Series {
		for _, p := range s.Points {
			x := c.x(p[0])
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymax = math.Max(ymax, p[1])
		}
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	ymax = niceCeil(ymax)
	px := func(x float64) float64 { return padL + (c.x(x)-xmin)/(xmax-xmin)*(svgW-padL-padR) }
	py := func(y float64) float64 { return svgH - padB - (y-ymin)/(ymax-ymin)*(svgH-padT-padB) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", padL, esc(c.Title))
	// Axes, grid and ticks.
	for i := 0; i <= 5; i++ {
		y := ymin + (ymax-ymin)*float64(i)/5
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", padL, svgW-padR, py(y), py(y))
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, py(y)+4, Number(y))
	}
	for _, x := range c.xTicks(xmin, xmax) {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%g" y2="%g" stroke="#ddd"/>`+"\n", px(x), px(x), padT, svgH-padB)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", px(x), svgH-padB+16, Number(x))
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#444"/>`+"\n", padL, padT, svgW-padL-padR, svgH-padT-padB)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", padL+(svgW-padL-padR)/2, svgH-12.0, esc(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %g) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+(svgH-padT-padB)/2, esc(c.YLabel))
	// Lines and legend.
	for i, s := range c.Series {
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.Color, strings.Join(pts, " "))
		if len(s.Points) < 20 {
			for _, p := range s.Points {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(p[0]), py(p[1]), s.Color)
			}
		}
		ly := padT + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%g" y2="%g" stroke="%s" stroke-width="3"/>`+"\n", svgW-padR+12, svgW-padR+32, ly, ly, s.Color)
		fmt.Fprintf(&b, `<text x="%g" y="%g">%s</text>`+"\n", svgW-padR+38, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

func (c Chart) x(v float64) float64 {
	if c.LogX {
		return math.Log10(v)
	}
	return v
}

// xTicks returns tick values (in data units) across the x range.
func (c Chart) xTicks(xmin, xmax float64) []float64 {
	var ticks []float64
	if c.LogX {
		for e := math.Floor(xmin); e <= math.Ceil(xmax); e++ {
			if e >= xmin-1e-9 && e <= xmax+1e-9 {
				ticks = append(ticks, math.Pow(10, e))
			}
		}
		return ticks
	}
	step := niceCeil((xmax - xmin) / 6)
	for x := math.Ceil(xmin/step) * step; x <= xmax+1e-9; x += step {
		ticks = append(ticks, x)
	}
	return ticks
}

// Number formats a figure as the charts' ticks and the benchmark's tables
// show it: whole above 1,000, one decimal above 10, else two.
func Number(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
