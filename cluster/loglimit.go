package cluster

import "time"

// logLimiter bounds how many lines of one kind a node logs per interval,
// so that a client that can make the node log at will (a connection
// looping refused session requests) cannot flood the log. Lines past the
// bound are counted, and the next line let through says how many were
// left out. Not safe for concurrent use: its caller holds a lock.
type logLimiter struct {
	// burst is how many lines an interval lets through.
	burst int
	// every is the interval.
	every time.Duration

	start      time.Time // the current interval's start
	n          int       // lines let through in it
	suppressed int       // lines left out since the last one let through
}

// allow reports whether a line may be logged at now and, if so, how many
// were left out before it.
func (l *logLimiter) allow(now time.Time) (ok bool, suppressed int) {
	if now.Sub(l.start) >= l.every || now.Before(l.start) {
		l.start, l.n = now, 0
	}
	if l.n >= l.burst {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
