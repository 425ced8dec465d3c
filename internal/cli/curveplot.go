package cli

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kvload-exporter/kvload-exporter/synth"
)

// curvePlotPoints is how many points per doubling of capacity the plot's
// line has: smooth at any size, each point exact.
const curvePlotPoints = 24

// plotFormats are the image formats --plot draws in, by file extension.
var plotFormats = []string{"svg", "png", "jpg", "jpeg", "pdf", "eps", "tif", "tiff"}

// plotFormat is the image format path's extension names, svg without one;
// any other extension is refused rather than written as something else.
func plotFormat(path string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	switch {
	case ext == "":
		return "svg", nil
	case slices.Contains(plotFormats, ext):
		return ext, nil
	}
	return "", fmt.Errorf("--plot %s: .%s is not an image format the plot is drawn in (%s)", path, ext, strings.Join(plotFormats, ", "))
}

// writeCurvePlot draws the curve in path, in the format its extension
// names (plotFormat): the hit rate against the capacity on a log
// axis, the infinite-cache limit, and the capacities that reach 50, 90 and
// 99 % of it.
func writeCurvePlot(c *synth.CapacityCurve, path string) error {
	p, err := curvePlot(c)
	if err != nil {
		return fmt.Errorf("drawing the capacity curve: %w", err)
	}
	format, err := plotFormat(path)
	if err != nil {
		return err
	}
	w, err := p.WriterTo(16*vg.Centimeter, 10*vg.Centimeter, format)
	if err != nil {
		return fmt.Errorf("drawing the capacity curve: %w", err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		return fmt.Errorf("drawing the capacity curve: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating the directory of --plot: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing --plot: %w", err)
	}
	return nil
}

func curvePlot(c *synth.CapacityCurve) (*plot.Plot, error) {
	s := float64(c.ServerBlock)
	p := plot.New()
	p.Title.Text = "Token hit rate by KV capacity (LRU, replay order)"
	p.X.Label.Text = fmt.Sprintf("KV capacity, tokens (blocks of %d)", c.ServerBlock)
	p.Y.Label.Text = "token hit rate, %"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = tokenTicks{}
	p.Add(plotter.NewGrid())

	var line plotter.XYs
	for _, pt := range c.FinePoints(curvePlotPoints) {
		line = append(line, plotter.XY{X: float64(pt.CapacityBlocks) * s, Y: 100 * c.HitRate(pt.HitTokens)})
	}
	if len(line) == 0 {
		return nil, fmt.Errorf("the trace has no blocks to cache")
	}
	l, err := plotter.NewLine(line)
	if err != nil {
		return nil, err
	}
	l.StepStyle = plotter.PostStep
	l.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add("hit rate", l)

	limit := 100 * c.HitRate(c.InfiniteHitTokens)
	lim, err := plotter.NewLine(plotter.XYs{{X: line[0].X, Y: limit}, {X: line[len(line)-1].X, Y: limit}})
	if err != nil {
		return nil, err
	}
	lim.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	lim.Color = color.Gray{Y: 110}
	p.Add(lim)
	p.Legend.Add(fmt.Sprintf("infinite cache, %.2f %%", limit), lim)

	if err := addTargets(p, c); err != nil {
		return nil, err
	}
	// Bottom right: below the curve, which rises to the right.
	p.Legend.Top, p.Legend.Left = false, false
	p.Y.Min = 0
	p.Y.Max = max(limit*1.1, 1)
	return p, nil
}

// addTargets marks the capacities that reach 50, 90 and 99 % of the limit.
func addTargets(p *plot.Plot, c *synth.CapacityCurve) error {
	var pts plotter.XYs
	var labels []string
	for _, t := range c.Targets {
		if !t.Reached {
			continue
		}
		x := float64(t.CapacityBlocks * int64(c.ServerBlock))
		pts = append(pts, plotter.XY{X: x, Y: 100 * c.HitRate(t.HitTokens)})
		labels = append(labels, fmt.Sprintf("%d %%: %s", t.Percent, tokenLabel(x)))
	}
	if len(pts) == 0 {
		return nil
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	sc.GlyphStyle = draw.GlyphStyle{Shape: draw.CircleGlyph{}, Radius: vg.Points(3.5), Color: color.RGBA{R: 214, G: 39, B: 40, A: 255}}
	lb, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: labels})
	if err != nil {
		return err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].XAlign = draw.XRight
		lb.TextStyle[i].YAlign = draw.YBottom
	}
	lb.Offset = vg.Point{X: -vg.Points(5), Y: vg.Points(3)}
	p.Add(sc, lb)
	p.Legend.Add("50, 90, 99 % of the limit", sc)
	return nil
}

// tokenTicks labels a log axis of token counts at the powers of ten.
type tokenTicks struct{}

func (tokenTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(max(lo, 1))); e <= math.Ceil(math.Log10(max(hi, 1))); e++ {
		v := math.Pow(10, e)
		ticks = append(ticks, plot.Tick{Value: v, Label: tokenLabel(v)})
		for m := 2.0; m < 10; m++ {
			ticks = append(ticks, plot.Tick{Value: m * v})
		}
	}
	return ticks
}

// tokenLabel writes a token count in short: 512, 4.1k, 12M, 1.5G.
func tokenLabel(v float64) string {
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= u.div {
			return trimZero(fmt.Sprintf("%.1f", v/u.div)) + u.suffix
		}
	}
	return trimZero(fmt.Sprintf("%.0f", v))
}

func trimZero(s string) string {
	if len(s) > 2 && s[len(s)-2:] == ".0" {
		return s[:len(s)-2]
	}
	return s
}
