package svgchart

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSVGIsWellFormedWithALineAndALegendPerSeries(t *testing.T) {
	c := Chart{
		Title: "lateness <p99> & more", XLabel: "ms", YLabel: "%", LogX: true,
		Series: []Series{
			{Name: "a", Color: Colors[0], Points: [][2]float64{{1, 10}, {10, 50}, {100, 100}}},
			{Name: "b", Color: Colors[1], Points: [][2]float64{{2.5, 20}, {1000, 100}}},
		},
	}
	svg := string(c.SVG())
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	assert.Contains(t, svg, "lateness &lt;p99&gt; &amp; more")
	assert.Equal(t, 2, strings.Count(svg, "<polyline"))
	assert.Equal(t, 5, strings.Count(svg, "<circle"), "a dot per point of a short series")
	for _, tick := range []string{">1.00<", ">10.0<", ">100.0<", ">1000<"} {
		assert.Contains(t, svg, tick, "a tick at each power of ten")
	}
}

func TestNumber(t *testing.T) {
	assert.Equal(t, "0.25", Number(0.25))
	assert.Equal(t, "12.5", Number(12.5))
	assert.Equal(t, "12346", Number(12345.6))
}
