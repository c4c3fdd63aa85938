// Package testkit is support code shared by the tests of the module (and
// of the lab, cmd/ticketlab). It imports package testing, so no product
// package imports it (cmd/ticketing's TestBinaryCarriesNoLab pins that).
package testkit

import (
	"testing"
	"time"
)

// PollInterval is how often WaitFor and Eventually ask their condition:
// short against the bounds the tests give (seconds), long enough that a
// poll does not steal the CPU from what it waits for.
const PollInterval = 5 * time.Millisecond

// WaitFor polls cond until it holds; if it still does not after d, the
// test fails (t.Fatalf) naming what it waited for. Tests order events with
// it instead of sleeping: d bounds a mechanism, never a speed.
func WaitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	if !Eventually(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// Eventually polls cond until it holds (true) or d has passed (false), for
// a caller that reports the failure itself.
func Eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(PollInterval)
	}
	return true
}
