package cluster

import (
	"errors"

	"ticketing/cluster/wire"
)

// Sentinel errors of this package. Errors are wrapped with %w; test for
// them with errors.Is. (ErrSecretFile, of ReadSecretFile, is in
// secret.go.)
var (
	// ErrBadConfig wraps every configuration error (Config.Validate, a bad
	// admin request).
	ErrBadConfig = errors.New("cluster: bad config")
	// ErrVoterCount is returned for an initial membership that is not 3 or
	// 5 voters.
	ErrVoterCount = errors.New("cluster: a cluster has exactly 3 or 5 voters")
	// ErrIdentity wraps every problem with a data dir's identity.
	ErrIdentity = errors.New("cluster: data dir identity")
	// ErrClusterExists: Bootstrap found Raft state in its own data dir or
	// on another initial voter.
	ErrClusterExists = errors.New("cluster: the cluster already exists")
	// ErrClosing: the node was closed before Raft answered.
	ErrClosing = errors.New("cluster: node closing")

	// Membership changes (members.go).

	// ErrNotLeader: the change must be asked of the leader.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrChangeInProgress: another membership change has not finished.
	ErrChangeInProgress = errors.New("cluster: a membership change is in progress")
	// ErrUnsafeChange: the change would break a rule (voter count, the
	// failures the cluster survives, a voter that must answer).
	ErrUnsafeChange = errors.New("cluster: unsafe membership change")
	// ErrNoQuorum: fewer than a majority of the voters answer, so no
	// change can commit (and no order of changes can help); see the
	// README's runbook, "The majority is lost for good".
	ErrNoQuorum = errors.New("cluster: no majority of the voters answers")
	// ErrLearnerLagging: the learner trails the commit index by more than
	// MaxPromoteLag (or did not answer); try again once it caught up.
	ErrLearnerLagging = errors.New("cluster: the learner has not caught up")
	// ErrNoSuchMember: the server id is not in the configuration.
	ErrNoSuchMember = errors.New("cluster: no such member")

	// Planned hand-overs (handover.go).

	// ErrHandOverInProgress: another hand-over of this node's leadership
	// has not finished.
	ErrHandOverInProgress = errors.New("cluster: a leadership hand-over is in progress")
	// ErrNoTarget: no other voter answered, so there is nobody to hand the
	// leadership to.
	ErrNoTarget = errors.New("cluster: no voter to hand the leadership to")
)

// Sentinels that do not leave the package.
var (
	// errTLSOnPlainPort: a TLS ClientHello arrived on a plaintext port.
	errTLSOnPlainPort = errors.New("cluster: TLS ClientHello on a plaintext port")
	// errCorruptEntry: a domain ('D') or address ('A') log entry that does
	// not decode.
	errCorruptEntry = errors.New("cluster: corrupt log entry")
)

// adminCodes maps this package's sentinels to the admin reply codes. Order
// matters only to AdminCodeOf for an error that wraps several: ErrNoQuorum
// comes before ErrUnsafeChange, which a refusal for want of a quorum wraps
// too.
var adminCodes = []struct {
	err  error
	code string
}{
	{ErrNotLeader, wire.AdminNotLeader},
	{ErrNoQuorum, wire.AdminNoQuorum},
	{ErrUnsafeChange, wire.AdminUnsafe},
	{ErrLearnerLagging, wire.AdminLagging},
	{ErrChangeInProgress, wire.AdminInProgress},
	{ErrNoSuchMember, wire.AdminNoSuchMember},
	{ErrBadConfig, wire.AdminBadRequest},
}

// AdminCodeOf is the admin reply code of err (possibly wrapped):
// wire.AdminInternal when no sentinel of this package matches.
func AdminCodeOf(err error) string {
	for _, c := range adminCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return wire.AdminInternal
}

// AdminErrOf is the sentinel of an admin reply code (nil for
// wire.AdminInternal and for codes this version does not know), so that a
// client's error matches errors.Is(err, ErrNotLeader) and the like.
func AdminErrOf(code string) error {
	for _, c := range adminCodes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}
