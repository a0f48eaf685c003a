package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the result of a run, as written to the JSON file.
type Report struct {
	Machine   Machine          `json:"machine"`
	Options   ReportOptions    `json:"options"`
	StartedAt time.Time        `json:"started_at"`
	Elapsed   time.Duration    `json:"elapsed_ns"`
	Scenarios []ScenarioResult `json:"scenarios"`
	// PeakRSSBytes is the harness process's peak resident memory
	// (getrusage maxrss): arbor, the ceiling and River all run in it.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// DBOSPeakRSSBytes is the largest peak resident memory of a DBOS
	// subprocess run; 0 when DBOS did not run.
	DBOSPeakRSSBytes int64 `json:"dbos_peak_rss_bytes"`
}

// ReportOptions are the options that shape the figures.
type ReportOptions struct {
	Conns      int  `json:"conns"`
	ClaimBatch int  `json:"claim_batch"`
	Quick      bool `json:"quick"`
	Reps       int  `json:"reps"`
}

// ScenarioResult is one scenario's results at each of its sizes.
type ScenarioResult struct {
	Key     string       `json:"key"`
	Title   string       `json:"title"`
	About   string       `json:"about"`
	Goal    string       `json:"goal,omitempty"`
	Pending string       `json:"pending,omitempty"`
	Sizes   []SizeResult `json:"sizes,omitempty"`
}

// SizeResult is every subject's result at one size.
type SizeResult struct {
	Size     Size            `json:"size"`
	Subjects []SubjectResult `json:"subjects"`
}

// SubjectResult is one subject's result at one size.
type SubjectResult struct {
	Key         string       `json:"key"`
	Label       string       `json:"label"`
	Unavailable string       `json:"unavailable,omitempty"`
	Error       string       `json:"error,omitempty"`
	Measurement *Measurement `json:"measurement,omitempty"`
	// TasksPerSec and MicrosPerTask are the throughput figures.
	TasksPerSec   float64 `json:"tasks_per_sec,omitempty"`
	MicrosPerTask float64 `json:"micros_per_task,omitempty"`
	// P50Micros and P99Micros are the latency figures.
	P50Micros float64 `json:"p50_micros,omitempty"`
	P99Micros float64 `json:"p99_micros,omitempty"`
	MaxMicros float64 `json:"max_micros,omitempty"`
	// Per task: statements (round trips), commits (-1: not counted),
	// transaction ids, WAL bytes.
	StatementsPerTask float64 `json:"statements_per_task,omitempty"`
	CommitsPerTask    float64 `json:"commits_per_task,omitempty"`
	XIDsPerTask       float64 `json:"xids_per_task,omitempty"`
	WALBytesPerTask   float64 `json:"wal_bytes_per_task,omitempty"`
	// CPU per task in microseconds: the client's, the server's (-1: not
	// measured).
	ClientCPUMicrosPerTask float64 `json:"client_cpu_micros_per_task,omitempty"`
	ServerCPUMicrosPerTask float64 `json:"server_cpu_micros_per_task,omitempty"`
	// Ratios, for an arbor subject, are its tasks/s divided by each
	// baseline's, by the baseline's key: above 1, arbor is faster. A
	// baseline without a figure has no entry.
	Ratios map[string]float64 `json:"ratios,omitempty"`
}

func (r *SubjectResult) fill(metric Metric, m *Measurement) {
	r.Measurement = m
	if m.Tasks <= 0 || m.Elapsed <= 0 {
		return
	}
	n := float64(m.Tasks)
	r.TasksPerSec = n / m.Elapsed.Seconds()
	r.MicrosPerTask = float64(m.Elapsed.Microseconds()) / n
	r.StatementsPerTask = float64(m.Statements) / n
	r.CommitsPerTask = -1
	if m.Commits >= 0 {
		r.CommitsPerTask = float64(m.Commits) / n
	}
	r.XIDsPerTask = float64(m.XIDs) / n
	r.ClientCPUMicrosPerTask = micros(m.ClientCPU) / n
	r.ServerCPUMicrosPerTask = -1
	if m.ServerCPU >= 0 {
		r.ServerCPUMicrosPerTask = micros(m.ServerCPU) / n
	}
	r.WALBytesPerTask = float64(m.WALBytes) / n
	if metric == Latency && len(m.Latencies) > 0 {
		r.P50Micros = micros(percentile(m.Latencies, 0.50))
		r.P99Micros = micros(percentile(m.Latencies, 0.99))
		r.MaxMicros = micros(slices.Max(m.Latencies))
	}
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// percentile returns the q-quantile of ds (nearest rank).
func percentile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// WriteJSON writes the report to path, indented.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func printMachine(w io.Writer, r *Report) {
	m := r.Machine
	fmt.Fprintf(w, "arbor bench — %s", r.StartedAt.Format(time.RFC3339))
	if r.Machine.Revision != "" {
		fmt.Fprintf(w, ", revision %s", r.Machine.Revision)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "machine: %d cores (%s), %s memory, %s/%s, %s\n", m.NumCPU, m.CPUModel,
		bytesText(m.MemTotalBytes), m.GOOS, m.GOARCH, m.GoVersion)
	fmt.Fprintf(w, "postgres: %s, fsync=%s, synchronous_commit=%s, shared_buffers=%s\n",
		m.PostgresVersion, m.Fsync, m.SynchronousCommit, m.SharedBuffers)
	fmt.Fprintf(w, "options: %d connections for every subject, claim batch %d, best of %d rep(s)%s\n\n",
		r.Options.Conns, r.Options.ClaimBatch, r.Options.Reps, map[bool]string{true: ", quick sizes"}[r.Options.Quick])
}

func printScenario(w io.Writer, s Scenario, res ScenarioResult) {
	fmt.Fprintf(w, "(%s) %s\n", s.Key, s.Title)
	if s.Pending != "" {
		fmt.Fprintf(w, "    %s\n\n", s.Pending)
		return
	}
	for _, line := range wrap(s.About, 96) {
		fmt.Fprintf(w, "    %s\n", line)
	}
	for _, sub := range s.Subjects {
		fmt.Fprintf(w, "    %s = %s\n", sub.Key, sub.Label)
	}
	var notes []string
	note := func(text string) string {
		for i, n := range notes {
			if n == text {
				return fmt.Sprintf("[%d]", i+1)
			}
		}
		notes = append(notes, text)
		return fmt.Sprintf("[%d]", len(notes))
	}
	type pair struct{ a, b string }
	var pairs []pair
	for _, a := range s.Subjects {
		for _, b := range s.Subjects {
			if a.Compared(b) {
				pairs = append(pairs, pair{a.Key, b.Key})
			}
		}
	}

	unit := s.Unit
	if unit == "" {
		unit = "task"
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"size", unit + "s"}
	figure := unit + "s/s "
	if s.Metric == Latency {
		figure = "p50/p99/max ms "
	}
	for i, sub := range s.Subjects {
		if i == 0 {
			head = append(head, figure+sub.Key)
		} else {
			head = append(head, sub.Key)
		}
	}
	if s.Metric == Throughput {
		for i, sub := range s.Subjects {
			if i == 0 {
				head = append(head, "µs/"+unit+" "+sub.Key)
			} else {
				head = append(head, sub.Key)
			}
		}
		for _, p := range pairs {
			head = append(head, p.a+"÷"+p.b)
		}
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, sr := range res.Sizes {
		row := []string{sr.Size.Spec, fmt.Sprint(sr.Size.Tasks)}
		for _, r := range sr.Subjects {
			switch {
			case r.Unavailable != "":
				row = append(row, "n/a"+note(r.Key+": "+r.Unavailable))
			case r.Error != "":
				row = append(row, "error"+note(r.Key+": "+r.Error))
			case r.Measurement == nil:
				row = append(row, "-")
			case s.Metric == Latency:
				row = append(row, fmt.Sprintf("%.1f/%.1f/%.1f", r.P50Micros/1e3, r.P99Micros/1e3, r.MaxMicros/1e3))
			default:
				row = append(row, fmt.Sprintf("%.0f", r.TasksPerSec))
			}
		}
		if s.Metric == Throughput {
			for _, r := range sr.Subjects {
				if r.MicrosPerTask > 0 {
					row = append(row, fmt.Sprintf("%.1f", r.MicrosPerTask))
				} else {
					row = append(row, "-")
				}
			}
			for _, p := range pairs {
				cell := "-"
				for _, r := range sr.Subjects {
					if v, ok := r.Ratios[p.b]; ok && r.Key == p.a {
						cell = ratioText(v)
					}
				}
				row = append(row, cell)
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	_ = tw.Flush()

	// What each subject cost the database, per task: the figures that say
	// why one is faster than another.
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  per "+unit+":\tsize\tstatements\tcommits\txids\tWAL bytes\tCPU µs client\tserver\tphases\t")
	for _, sub := range s.Subjects {
		for _, sr := range res.Sizes {
			for _, r := range sr.Subjects {
				if r.Key != sub.Key || r.Measurement == nil {
					continue
				}
				m := r.Measurement
				commits := "?"
				if r.CommitsPerTask >= 0 {
					commits = fmt.Sprintf("%.3f", r.CommitsPerTask)
				}
				server := "?"
				if r.ServerCPUMicrosPerTask >= 0 {
					server = fmt.Sprintf("%.0f", r.ServerCPUMicrosPerTask)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%s\t%.3f\t%.0f\t%.0f\t%s\t%s\t\n", sub.Key, sr.Size.Spec,
					r.StatementsPerTask, commits, r.XIDsPerTask, r.WALBytesPerTask, r.ClientCPUMicrosPerTask, server,
					phasesText(m.Phases))
			}
		}
	}
	_ = tw.Flush()
	for _, sr := range res.Sizes {
		for _, r := range sr.Subjects {
			if r.Measurement != nil && r.Measurement.Note != "" {
				note(r.Key + ": " + r.Measurement.Note)
			}
		}
	}
	for i, n := range notes {
		fmt.Fprintf(w, "  [%d] %s\n", i+1, n)
	}
	if s.Goal != "" {
		fmt.Fprintf(w, "  goal: %s\n", s.Goal)
	}
	fmt.Fprintln(w)
}

func printFooter(w io.Writer, r *Report) {
	fmt.Fprintf(w, "peak memory: harness process (arbor, ceiling, River) max RSS %s", bytesText(r.PeakRSSBytes))
	if r.DBOSPeakRSSBytes > 0 {
		fmt.Fprintf(w, "; DBOS subprocess max RSS %s", bytesText(r.DBOSPeakRSSBytes))
	}
	fmt.Fprintf(w, " (PostgreSQL's own memory not included)\n")
	fmt.Fprintf(w, "total time: %s\n", r.Elapsed.Round(100*time.Millisecond))
}

func ratioText(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0fx", r)
	}
	return fmt.Sprintf("%.2fx", r)
}

func phasesText(ph map[string]time.Duration) string {
	if len(ph) == 0 {
		return ""
	}
	keys := make([]string, 0, len(ph))
	for k := range ph {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, ph[k].Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

func wrap(text string, width int) []string {
	var lines []string
	var cur string
	for _, word := range strings.Fields(text) {
		if cur != "" && len(cur)+1+len(word) > width {
			lines = append(lines, cur)
			cur = ""
		}
		if cur != "" {
			cur += " "
		}
		cur += word
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}
