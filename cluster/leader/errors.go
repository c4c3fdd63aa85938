package leader

import "errors"

// Sentinel errors of this package.
var (
	// ErrBadConfig: Config.Validate found a field out of range.
	ErrBadConfig = errors.New("leader: bad config")
	// ErrNotLeading: a hand-over was asked of a core that does not lead
	// (or is closing).
	ErrNotLeading = errors.New("leader: not leading")
	// ErrHandOverActive: a hand-over was asked while another has not
	// finished.
	ErrHandOverActive = errors.New("leader: a hand-over is in progress")
)
