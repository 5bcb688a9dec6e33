package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progress draws "[#####.....]  45%  12.0 MiB / 27.0 MiB  5.1 MiB/s" on w,
// redrawn at most every 100 ms. total <= 0 means unknown size.
type progress struct {
	w     io.Writer
	total int64
	done  int64
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, total int64) *progress {
	return &progress{w: w, total: total, start: time.Now()}
}

func (p *progress) add(n int) {
	p.done += int64(n)
	if time.Since(p.last) >= 100*time.Millisecond {
		p.draw()
	}
}

func (p *progress) draw() {
	p.last = time.Now()
	rate := float64(p.done) / max(time.Since(p.start).Seconds(), 1e-3)
	if p.total > 0 {
		const width = 30
		filled := int(float64(width) * float64(p.done) / float64(p.total))
		filled = min(max(filled, 0), width)
		fmt.Fprintf(p.w, "\r[%s%s] %3d%%  %s / %s  %s/s ", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
			p.done*100/p.total, mib(p.done), mib(p.total), mib(int64(rate)))
		return
	}
	fmt.Fprintf(p.w, "\r%s  %s/s ", mib(p.done), mib(int64(rate)))
}

func (p *progress) finish() {
	p.draw()
	fmt.Fprintln(p.w)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
