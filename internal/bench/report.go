package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as an aligned text table: one row per path,
// baselines marked, ratios against every baseline of the phase.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "machine: %s\n", r.Machine)
	if r.Gateway != "" {
		fmt.Fprintf(w, "gateway: %s\n", r.Gateway)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tpath\trate\tunit\tp50 ms\tp99 ms\tp99.9 ms\tgw RSS MiB\tgw CPU\tgw µs/op\tvs baseline\t")
	for _, x := range r.Results {
		path := x.Path
		if x.Baseline {
			path = "[base] " + path
		}
		var ratios []string
		for _, q := range x.Ratios {
			ratios = append(ratios, fmt.Sprintf("%.2fx %s", q.X, short(q.Baseline)))
		}
		if x.CPURatio > 0 {
			ratios = append(ratios, fmt.Sprintf("CPU/doc %.2fx", x.CPURatio))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", x.Phase, path, num(x.Rate), x.Unit,
			opt(x.P50ms), opt(x.P99ms), opt(x.P999ms), opt(x.PeakRSSMiB), pct(x.GatewayCPUPc), opt(x.CPUPerOpUs), strings.Join(ratios, ", "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, x := range r.Results {
		if x.Note != "" {
			fmt.Fprintf(w, "note: %s, %s: %s\n", x.Phase, x.Path, x.Note)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

func short(baseline string) string {
	switch {
	case strings.HasPrefix(baseline, "raw quic-go echo"):
		return "quic-go echo"
	case strings.HasPrefix(baseline, "raw quic-go"):
		return "quic-go"
	case strings.HasPrefix(baseline, "bare grpc-go"):
		return "grpc-go"
	case strings.HasPrefix(baseline, "JetStream") && strings.HasSuffix(baseline, "fsync each"):
		return "JetStream fsync"
	case strings.HasPrefix(baseline, "JetStream"):
		return "JetStream no fsync"
	case strings.HasSuffix(baseline, ", SQLite"):
		return "SQLite docs/s"
	}
	return baseline
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func opt(v float64) string {
	if v == 0 {
		return "-"
	}
	return num(v)
}

func pct(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", v)
}
