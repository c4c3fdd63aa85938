package sidecar

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// deadlineList against a naive model (a slice sorted by deadline, ties in
// insertion order): random inserts with deadlines near the tail's (as
// concurrent releases make), removals anywhere, and pops of what is due.
func TestDeadlineListAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		var l deadlineList
		var model []*releaseJob
		base := time.Unix(1000, 0)
		now := base
		for step := 0; step < 300; step++ {
			switch op := rng.IntN(10); {
			case op < 5:
				// A deadline a little before or after the latest so far.
				job := &releaseJob{deadline: now.Add(5*time.Second + time.Duration(rng.IntN(40)-20)*time.Millisecond)}
				l.insert(job)
				i := len(model)
				for i > 0 && model[i-1].deadline.After(job.deadline) {
					i--
				}
				model = slices.Insert(model, i, job)
			case op < 7 && len(model) > 0:
				i := rng.IntN(len(model))
				l.remove(model[i])
				l.remove(model[i]) // a second remove does nothing
				model = slices.Delete(model, i, i+1)
			default:
				now = now.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
				for {
					got := l.popDue(now)
					var want *releaseJob
					if len(model) > 0 && !now.Before(model[0].deadline) {
						want, model = model[0], model[1:]
					}
					if got != want {
						t.Fatalf("seed %d step %d: popDue gave %p, want %p", seed, step, got, want)
					}
					if got == nil {
						break
					}
					if got.dlisted {
						t.Fatalf("seed %d step %d: a popped job is still listed", seed, step)
					}
				}
			}
			var listed []*releaseJob
			for j := l.head; j != nil; j = j.dnext {
				listed = append(listed, j)
				if j.dnext == nil && l.tail != j {
					t.Fatalf("seed %d step %d: the tail is not the last job", seed, step)
				}
				if j.dnext != nil && j.dnext.dprev != j {
					t.Fatalf("seed %d step %d: broken back link", seed, step)
				}
			}
			if !slices.Equal(listed, model) {
				t.Fatalf("seed %d step %d: list %v, model %v", seed, step, listed, model)
			}
		}
	}
}
