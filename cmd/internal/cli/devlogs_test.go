package cli

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// devLogs: while dev starts its nodes their warnings go to info and errors
// pass; once serving both pass; while it stops them both go to info (a
// follower closing under the leader's replication makes raft log errors on
// both sides, which CI saw break a quiet Ctrl-C), and --log-level info still
// shows them.
func TestDevLogsQuietWhileStopping(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelWarn, slog.LevelInfo} {
		var buf bytes.Buffer
		d := newDevLogs(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
		log := slog.New(d).With("component", "raft")
		line := func(f func(string, ...any), msg string) string {
			t.Helper()
			buf.Reset()
			f(msg)
			return buf.String()
		}
		type step struct {
			phase  string
			log    func(string, ...any)
			msg    string
			want   string // the level shown at --log-level warn; "" hidden
			atInfo string // the level shown at --log-level info
		}
		steps := []step{
			{"starting", log.Warn, "heartbeat timeout reached", "", "INFO"},
			{"starting", log.Error, "failed to open the store", "ERROR", "ERROR"},
			{"serving", log.Warn, "a lost follower", "WARN", "WARN"},
			{"serving", log.Error, "failed to appendEntries", "ERROR", "ERROR"},
			{"stopping", log.Warn, "shutting down", "", "INFO"},
			{"stopping", log.Error, "failed to decode incoming command: transport shutdown", "", "INFO"},
		}
		for _, s := range steps {
			switch s.phase {
			case "serving":
				d.serving()
			case "stopping":
				d.stopping()
			}
			want := s.want
			if level == slog.LevelInfo {
				want = s.atInfo
			}
			got := line(s.log, s.msg)
			if want == "" && got != "" || want != "" && !strings.Contains(got, "level="+want+" ") {
				t.Errorf("--log-level %v, %s, %q: logged %q, want level %q", level, s.phase, s.msg, got, want)
			}
		}
	}
}
