package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// sample is a set of measurements of one quantity.
type sample []float64

// quantile returns the q-quantile (0..1) by linear interpolation between
// the closest ranks; NaN for an empty sample.
func (s sample) quantile(q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	v := append([]float64(nil), s...)
	sort.Float64s(v)
	pos := q * float64(len(v)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return v[lo] + (v[hi]-v[lo])*(pos-float64(lo))
}

func (s sample) median() float64 { return s.quantile(0.5) }
func (s sample) min() float64    { return s.quantile(0) }
func (s sample) max() float64    { return s.quantile(1) }

// durations turns durations into seconds.
func durations(ds []time.Duration) sample {
	out := make(sample, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds()
	}
	return out
}

// row is one line of the result table.
type row struct {
	Figure string // what was measured
	Value  string // the median (or the named percentile)
	Spread string // min–max or p10–p90 of the repeated runs
	N      string // how many runs / samples
	Note   string // what the figure includes, caveats
}

// fmtSeconds prints seconds with a unit that keeps 2–3 significant digits.
func fmtSeconds(s float64) string {
	switch {
	case math.IsNaN(s):
		return "n/a"
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 10:
		return fmt.Sprintf("%.2f s", s)
	case s < 120:
		return fmt.Sprintf("%.1f s", s)
	}
	return fmt.Sprintf("%d min %02d s", int(s)/60, int(s)%60)
}

func fmtNum(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func fmtMiB(bytes float64) string { return fmt.Sprintf("%.1f MiB", bytes/(1<<20)) }

// rangeOf prints "lo–hi" with the given formatter.
func rangeOf(lo, hi float64, f func(float64) string) string {
	return f(lo) + " – " + f(hi)
}

var header = row{"figure", "median", "spread", "n", "note"}

// printText prints rows as aligned text columns.
func printText(w io.Writer, rows []row) {
	cells := func(r row) []string { return []string{r.Figure, r.Value, r.Spread, r.N, r.Note} }
	width := make([]int, 5)
	for _, r := range append([]row{header}, rows...) {
		for i, c := range cells(r) {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(r row) {
		var b strings.Builder
		for i, c := range cells(r) {
			b.WriteString(c)
			if i < 4 {
				b.WriteString(strings.Repeat(" ", width[i]-len([]rune(c))+2))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	line(header)
	total := 8
	for _, n := range width {
		total += n
	}
	fmt.Fprintln(w, strings.Repeat("-", total))
	for _, r := range rows {
		line(r)
	}
}

// printMarkdown prints rows as a markdown table, for docs/performance.md.
func printMarkdown(w io.Writer, rows []row) {
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", header.Figure, header.Value, header.Spread, header.N, header.Note)
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", esc(r.Figure), esc(r.Value), esc(r.Spread), esc(r.N), esc(r.Note))
	}
}
