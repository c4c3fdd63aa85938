package sidecar

import "time"

// The first attempts' deadlines (startRelease) share one timer. Every
// first attempt's deadline is its start plus Config.ReleaseDeadline, so
// each joins a list kept in deadline order at (almost always) its tail,
// and one timer armed for the list's head stands for all of them. A timer
// per release (time.AfterFunc, then Stop when the reply came first) cost
// an allocation and two timer-heap updates per release: a tenth of the
// sidecar's CPU per cycle at 256 clients went to timers.
//
// The list and the timer are guarded by Broker.dmu, a leaf: taken under
// releaseJob.amu (watchDeadline, unwatchDeadline) and alone by the timer,
// which calls releaseTimedOut with no lock held.

// deadlineList is the first attempts in flight in deadline order, linked
// through releaseJob.dprev and dnext.
type deadlineList struct {
	head, tail *releaseJob
}

// insert puts job after the last job whose deadline is not later than its
// own: almost always the tail (two releases asked at once may get here in
// either order).
func (l *deadlineList) insert(job *releaseJob) {
	prev := l.tail
	for prev != nil && prev.deadline.After(job.deadline) {
		prev = prev.dprev
	}
	var next *releaseJob
	if prev != nil {
		next = prev.dnext
		prev.dnext = job
	} else {
		next = l.head
		l.head = job
	}
	if next != nil {
		next.dprev = job
	} else {
		l.tail = job
	}
	job.dprev, job.dnext, job.dlisted = prev, next, true
}

// remove takes job off the list, if it is on it.
func (l *deadlineList) remove(job *releaseJob) {
	if !job.dlisted {
		return
	}
	if job.dprev != nil {
		job.dprev.dnext = job.dnext
	} else {
		l.head = job.dnext
	}
	if job.dnext != nil {
		job.dnext.dprev = job.dprev
	} else {
		l.tail = job.dprev
	}
	job.dprev, job.dnext, job.dlisted = nil, nil, false
}

// popDue takes the head off the list if its deadline is not after now.
func (l *deadlineList) popDue(now time.Time) *releaseJob {
	job := l.head
	if job == nil || now.Before(job.deadline) {
		return nil
	}
	l.remove(job)
	return job
}

// watchDeadline puts job's first attempt under the shared deadline timer.
// Requires job.amu (the attempt is not over).
func (b *Broker) watchDeadline(job *releaseJob) {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	b.dlist.insert(job)
	if !b.darmed || b.dlist.head == job {
		b.darmed = true
		d := max(job.deadline.Sub(b.cfg.Now()), 0)
		if b.dtimer == nil {
			b.dtimer = time.AfterFunc(d, b.deadlinesDue)
		} else {
			b.dtimer.Reset(d)
		}
	}
}

// unwatchDeadline takes job off the list, if it is on it. The timer stays
// armed: when it fires early for a head that went, it only re-arms.
func (b *Broker) unwatchDeadline(job *releaseJob) {
	b.dmu.Lock()
	b.dlist.remove(job)
	b.dmu.Unlock()
}

// deadlinesDue is the shared timer: the attempts whose deadline passed
// time out, and the timer is armed again for the next one.
func (b *Broker) deadlinesDue() {
	var due []*releaseJob
	b.dmu.Lock()
	now := b.cfg.Now()
	for job := b.dlist.popDue(now); job != nil; job = b.dlist.popDue(now) {
		due = append(due, job)
	}
	if h := b.dlist.head; h != nil {
		b.dtimer.Reset(max(h.deadline.Sub(now), 0))
	} else {
		b.darmed = false
	}
	b.dmu.Unlock()
	for _, job := range due {
		b.releaseTimedOut(job)
	}
}
