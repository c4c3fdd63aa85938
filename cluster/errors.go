package cluster

import (
	"errors"

	"ticketing/cluster/wire"
)

// Sentinel errors of this package. Errors are wrapped with %w; test for
// them with errors.Is.
var (
	// ErrBadConfig wraps every configuration error (Config.Validate, a bad
	// admin request). It also matches wire.ErrBadRequest (errors.Is), so a
	// bad admin request is answered with the code bad_request; the admin
	// client reports that code as wire.ErrBadRequest.
	ErrBadConfig error = badConfig{}
	// ErrVoterCount is returned for an initial membership that is not 3 or
	// 5 voters.
	ErrVoterCount = errors.New("cluster: a cluster has exactly 3 or 5 voters")
	// ErrIdentity wraps every problem with a data dir's identity.
	ErrIdentity = errors.New("cluster: data dir identity")
	// ErrClusterExists: Bootstrap found Raft state in its own data dir or
	// on another initial voter.
	ErrClusterExists = errors.New("cluster: the cluster already exists")
	// ErrSecretFile wraps every problem with a secret file (ReadSecretFile).
	ErrSecretFile = errors.New("cluster: secret file")
	// ErrClosing: the node was closed before Raft answered.
	ErrClosing = errors.New("cluster: node closing")
	// ErrLogStoreMismatch: the data dir holds a log store of another kind
	// than the one asked for (Config.LogStore, --log-store), or both kinds.
	ErrLogStoreMismatch = errors.New("cluster: the data dir holds another log store")
	// ErrLogStoreMissing: the data dir has a server identity but no log
	// store: its log, term and vote were lost.
	ErrLogStoreMissing = errors.New("cluster: the data dir lost its log store")

	// Membership changes (members.go). These are the sentinels of the
	// admin reply codes, which cluster/wire owns (adminCodeTable there):
	// the same values, so errors.Is matches either spelling for errors of
	// the node and of the admin client (cluster/client) alike.

	// ErrNotLeader: the change must be asked of the leader.
	ErrNotLeader = wire.ErrNotLeader
	// ErrChangeInProgress: another membership change has not finished.
	ErrChangeInProgress = wire.ErrChangeInProgress
	// ErrUnsafeChange: the change would break a rule (voter count, the
	// failures the cluster survives, a voter that must answer).
	ErrUnsafeChange = wire.ErrUnsafeChange
	// ErrNoQuorum: fewer than a majority of the voters answer, so no
	// change can commit (and no order of changes can help); see
	// docs/operations.md's runbook, "The majority is lost for good". (The
	// admin code no_quorum; not wire.ErrNoQuorum, the client port's.)
	ErrNoQuorum = wire.ErrNoVoterMajority
	// ErrLearnerLagging: the learner trails the commit index by more than
	// MaxPromoteLag (or did not answer); try again once it caught up.
	ErrLearnerLagging = wire.ErrLearnerLagging
	// ErrNoSuchMember: the server id is not in the configuration.
	ErrNoSuchMember = wire.ErrNoSuchMember

	// Planned hand-overs (handover.go).

	// ErrHandOverInProgress: another hand-over of this node's leadership
	// has not finished.
	ErrHandOverInProgress = errors.New("cluster: a leadership hand-over is in progress")
	// ErrNoTarget: no other voter answered at the cluster version or
	// newer, so there is nobody to hand the leadership to (the error says
	// why of each voter).
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

// badConfig is ErrBadConfig: its own text, and the admin code of
// wire.ErrBadRequest.
type badConfig struct{}

func (badConfig) Error() string        { return "cluster: bad config" }
func (badConfig) Is(target error) bool { return target == wire.ErrBadRequest }
