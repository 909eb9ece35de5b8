package main

import (
	"fmt"
	"math"
	"os"
	"strings"
)

// series is one line of a chart.
type series struct {
	name   string
	color  string
	points [][2]float64
}

// chart is a line chart written as a small standalone SVG.
type chart struct {
	title, xLabel, yLabel string
	logX                  bool
	series                []series
}

const (
	svgW, svgH                     = 720, 420
	padL, padR, padT, padB float64 = 70, 170, 40, 55
)

func (c chart) write(path string) error {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), 0.0, math.Inf(-1)
	for _, s := range c.series {
		for _, p := range s.points {
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
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", padL, esc(c.title))
	// Axes, grid and ticks.
	for i := 0; i <= 5; i++ {
		y := ymin + (ymax-ymin)*float64(i)/5
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", padL, svgW-padR, py(y), py(y))
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, py(y)+4, num(y))
	}
	for _, x := range c.xTicks(xmin, xmax) {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%g" y2="%g" stroke="#ddd"/>`+"\n", px(x), px(x), padT, svgH-padB)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", px(x), svgH-padB+16, num(x))
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#444"/>`+"\n", padL, padT, svgW-padL-padR, svgH-padT-padB)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", padL+(svgW-padL-padR)/2, svgH-12.0, esc(c.xLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %g) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+(svgH-padT-padB)/2, esc(c.yLabel))
	// Lines and legend.
	for i, s := range c.series {
		var pts []string
		for _, p := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		if len(s.points) < 20 {
			for _, p := range s.points {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(p[0]), py(p[1]), s.color)
			}
		}
		ly := padT + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%g" x2="%g" y1="%g" y2="%g" stroke="%s" stroke-width="3"/>`+"\n", svgW-padR+12, svgW-padR+32, ly, ly, s.color)
		fmt.Fprintf(&b, `<text x="%g" y="%g">%s</text>`+"\n", svgW-padR+38, ly+4, esc(s.name))
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func (c chart) x(v float64) float64 {
	if c.logX {
		return math.Log10(v)
	}
	return v
}

// xTicks returns tick values (in data units) across the x range.
func (c chart) xTicks(xmin, xmax float64) []float64 {
	var ticks []float64
	if c.logX {
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
