package wire

import (
	"errors"
	"testing"
)

// A node's error text starts with its sentinel's message; the client's
// error does not say it twice ("wire: too many keys: wire: too many keys:
// ...", as the sidecar's ERR lines did).
func TestRemoteErrSaysTheSentinelOnce(t *testing.T) {
	for _, c := range []struct {
		code Code
		text string
		want string
	}{
		{CodeTooManyKeys, "wire: too many keys: 4 keys held", "wire: too many keys: 4 keys held"},
		{CodeTooManyWaiters, `wire: too many waiters on key "k": 3 waiting`, `wire: too many waiters on key "k": 3 waiting`},
		{CodeTooManyKeys, "wire: too many keys", "wire: too many keys"},
		{CodeTooManyKeys, "something else", "wire: too many keys: something else"},
	} {
		err := RemoteErr(c.code, c.text)
		if err.Error() != c.want || !errors.Is(err, ErrOf(c.code)) {
			t.Errorf("RemoteErr(%v, %q) = %q, want %q wrapping its sentinel", c.code, c.text, err, c.want)
		}
	}
}
