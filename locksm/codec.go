package locksm

// A Raft log entry carries a batch of commands (so the leader can group many
// clients' requests into one entry). The encoding is owned here.
// TODO(helper): document the byte layout in this comment: version byte, count,
// per command: op, now, key, owner, token, ref, lease, wait (only the fields
// the op uses), with varints where they make it compact.

// MaxBatch is the most commands one entry may carry.
const MaxBatch = 4096

// AppendBatch appends the encoding of cmds to dst.
func AppendBatch(dst []byte, cmds []Command) []byte { panic("TODO") }

// DecodeBatch decodes an entry produced by AppendBatch, appending the
// commands to into. Corrupt input gives an error wrapping ErrCorruptCommand
// (never a panic, never an allocation larger than the input warrants).
func DecodeBatch(b []byte, into []Command) ([]Command, error) { panic("TODO") }

// ValidateKey and ValidateOwner check the field constraints (see MaxKeyLen).
func ValidateKey(key string) error     { panic("TODO") }
func ValidateOwner(owner string) error { panic("TODO") }
