package benchsummary

import (
	"fmt"
	"strings"
	"testing"
)

type recorder struct {
	testing.TB
	lines []string
}

func (r *recorder) Helper()         {}
func (r *recorder) Log(args ...any) { r.lines = append(r.lines, fmt.Sprint(args...)) }
func (r *recorder) Logf(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func TestLogWritesOneParsableRow(t *testing.T) {
	r := &recorder{TB: t}
	Log(r, Row{Target: "relay | pg_recvlogical", Figure: "52000 events/s", Limit: "100000 events/s", Ratio: 0.52, Goal: ">= 0.70"})
	if len(r.lines) != 1 {
		t.Fatalf("%d lines", len(r.lines))
	}
	fields := strings.Split(r.lines[0], "|")
	want := []string{"SUMMARY", "relay / pg_recvlogical", "52000 events/s", "100000 events/s", "0.520", ">= 0.70", "MISSED"}
	if strings.Join(fields, ",") != strings.Join(want, ",") {
		t.Fatalf("row %q, want fields %q", r.lines[0], want)
	}
}
