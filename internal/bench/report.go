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
	// GoWorkflowsPeakRSSBytes is the same for the go-workflows subprocess.
	GoWorkflowsPeakRSSBytes int64 `json:"goworkflows_peak_rss_bytes"`
}

// ReportOptions are the options that shape the figures.
type ReportOptions struct {
	Conns      int  `json:"conns"`
	ClaimBatch int  `json:"claim_batch"`
	Quick      bool `json:"quick"`
	// Rounds is Options.Rounds: how many rounds the throughput scenarios'
	// subjects ran in at each size (a scenario or subject capped by
	// MaxRounds ran in fewer).
	Rounds int `json:"rounds"`
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
	Size Size `json:"size"`
	// Rounds is the number of rounds run at this size (the scenario's cap
	// applied); each subject's Rounds says which it ran in.
	Rounds   int             `json:"rounds"`
	Subjects []SubjectResult `json:"subjects"`
}

// Figures are what one run measured, per task, or their medians over the
// rounds.
type Figures struct {
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
}

// RoundResult is one subject's run in one round.
type RoundResult struct {
	// Round numbers the round, from 1; Position is the place the subject
	// ran at in it, from 1.
	Round    int `json:"round"`
	Position int `json:"position"`
	Figures
	Measurement *Measurement `json:"measurement"`
}

// SubjectResult is one subject's result at one size: its run in each
// round, and the medians over them.
type SubjectResult struct {
	Key         string `json:"key"`
	Label       string `json:"label"`
	Unavailable string `json:"unavailable,omitempty"`
	// Error is why a run failed. A failed run voids the subject's figures
	// at this size (Rounds is then empty): a median that skipped failures
	// would flatter it.
	Error string `json:"error,omitempty"`
	// Figures are each figure's median over Rounds.
	Figures
	// Measurement is the run of the median round (by tasks/s; by p99 for a
	// latency scenario), whose phases and note the table shows.
	Measurement *Measurement `json:"measurement,omitempty"`
	// Rounds are the subject's runs, in round order.
	Rounds []RoundResult `json:"rounds,omitempty"`
	// Ratios, for an arbor subject, are its tasks/s divided by each
	// baseline's, by the baseline's key, computed per round from the two
	// runs of that round (above 1, arbor is faster); in a latency
	// scenario, its p99 divided by the baseline's (above 1, arbor's is
	// longer). A baseline without a round in common has no entry.
	Ratios map[string]Spread `json:"ratios,omitempty"`
}

// figuresOf returns the per-task figures of one run.
func figuresOf(metric Metric, m *Measurement) Figures {
	var f Figures
	if m.Tasks <= 0 || m.Elapsed <= 0 {
		return f
	}
	n := float64(m.Tasks)
	f.TasksPerSec = n / m.Elapsed.Seconds()
	f.MicrosPerTask = float64(m.Elapsed.Microseconds()) / n
	f.StatementsPerTask = float64(m.Statements) / n
	f.CommitsPerTask = -1
	if m.Commits >= 0 {
		f.CommitsPerTask = float64(m.Commits) / n
	}
	f.XIDsPerTask = float64(m.XIDs) / n
	f.ClientCPUMicrosPerTask = micros(m.ClientCPU) / n
	f.ServerCPUMicrosPerTask = -1
	if m.ServerCPU >= 0 {
		f.ServerCPUMicrosPerTask = micros(m.ServerCPU) / n
	}
	f.WALBytesPerTask = float64(m.WALBytes) / n
	if metric == Latency && len(m.Latencies) > 0 {
		f.P50Micros = micros(percentile(m.Latencies, 0.50))
		f.P99Micros = micros(percentile(m.Latencies, 0.99))
		f.MaxMicros = micros(slices.Max(m.Latencies))
	}
	return f
}

// summarize sets r's figures to the medians over its rounds and its
// Measurement to the median round's.
func (r *SubjectResult) summarize(metric Metric) {
	if len(r.Rounds) == 0 {
		return
	}
	r.Figures = medianFigures(r.Rounds)
	key := func(f Figures) float64 { return f.TasksPerSec }
	if metric == Latency {
		key = func(f Figures) float64 { return f.P99Micros }
	}
	r.Measurement = r.Rounds[medianRound(r.Rounds, key)].Measurement
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
	fmt.Fprintf(w, "options: %d connections for every subject, claim batch %d, %d interleaved round(s) at each size "+
		"(figures: the median over the rounds; ratios: the median of the per-round ratios, min–max)%s\n\n",
		r.Options.Conns, r.Options.ClaimBatch, r.Options.Rounds, map[bool]string{true: ", quick sizes"}[r.Options.Quick])
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
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	_ = tw.Flush()

	// Each ratio per round, as the median and range of the rounds both
	// sides ran in, with what each side cost in CPU per task beside it.
	if len(pairs) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		ratio := "ratio"
		if s.Metric == Latency {
			ratio = "p99 ratio"
		}
		fmt.Fprintln(tw, "  "+ratio+"\tsize\tmedian (min–max)\trounds\tCPU µs/"+unit+" client/server of each side (medians)\t")
		for _, p := range pairs {
			for _, sr := range res.Sizes {
				a, b := sr.subject(p.a), sr.subject(p.b)
				cell, rounds := "-", "0"
				if ratio, ok := a.Ratios[p.b]; ok {
					cell, rounds = spreadText(ratio), fmt.Sprint(len(ratio.Values))
				}
				fmt.Fprintf(tw, "  %s÷%s\t%s\t%s\t%s\t%s ÷ %s\t\n", p.a, p.b, sr.Size.Spec, cell, rounds, cpuText(a), cpuText(b))
			}
		}
		_ = tw.Flush()
	}

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
	printWAL(w, s, res, unit)
	printStatements(w, s, res, unit)
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
	if r.GoWorkflowsPeakRSSBytes > 0 {
		fmt.Fprintf(w, "; go-workflows subprocess max RSS %s", bytesText(r.GoWorkflowsPeakRSSBytes))
	}
	fmt.Fprintf(w, " (PostgreSQL's own memory not included)\n")
	fmt.Fprintf(w, "total time: %s\n", r.Elapsed.Round(100*time.Millisecond))
}

// subject returns the result of the subject key at this size (the zero
// SubjectResult when there is none).
func (sr *SizeResult) subject(key string) SubjectResult {
	for _, r := range sr.Subjects {
		if r.Key == key {
			return r
		}
	}
	return SubjectResult{}
}

// cpuText prints a subject's median CPU per task as "client/server" in
// µs, "?" for a server not measured, "-" without a figure.
func cpuText(r SubjectResult) string {
	if len(r.Rounds) == 0 {
		return "-"
	}
	server := "?"
	if r.ServerCPUMicrosPerTask >= 0 {
		server = fmt.Sprintf("%.0f", r.ServerCPUMicrosPerTask)
	}
	return fmt.Sprintf("%.0f/%s", r.ClientCPUMicrosPerTask, server)
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

// walShown is how many of a run's largest WAL shares printWAL lists.
const walShown = 16

// printWAL lists, for every measured run that read its WAL by relation
// (Options.WALByRelation), its largest shares per task (the median
// round's run).
func printWAL(w io.Writer, s Scenario, res ScenarioResult, unit string) {
	for _, sub := range s.Subjects {
		for _, sr := range res.Sizes {
			for _, r := range sr.Subjects {
				if r.Key != sub.Key || r.Measurement == nil || len(r.Measurement.WAL) == 0 || r.Measurement.Tasks == 0 {
					continue
				}
				m := r.Measurement
				fmt.Fprintf(w, "  WAL by relation, %s at %s, per %s (largest %d of %d; page images: full-page images among the bytes):\n", sub.Key, sr.Size.Spec, unit, min(walShown, len(m.WAL)), len(m.WAL))
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintln(tw, "    relation\trecord\tbytes\trecords\tof which page images\t")
				for _, sh := range m.WAL[:min(walShown, len(m.WAL))] {
					fmt.Fprintf(tw, "    %s\t%s\t%.1f\t%.2f\t%.1f\t\n", sh.Relation, sh.Record,
						float64(sh.Bytes)/float64(m.Tasks), float64(sh.Records)/float64(m.Tasks), float64(sh.FPIBytes)/float64(m.Tasks))
				}
				_ = tw.Flush()
			}
		}
	}
}
