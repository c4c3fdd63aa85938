// Package console is the operators' live web console of a node (issue 42):
// one page, embedded in the binary with its script and style sheet, that
// shows the cluster, its hottest lines, one key with its holder and line,
// and the sidecars' sessions, updated every second over server-sent
// events.
//
// The package owns the HTTP side only: what the page shows comes from a
// Source, which the node implements (cluster.Node.ConsoleSource), and a
// Console samples it once per Interval into a short history, so that a
// page that connects gets full charts at once and every page costs the
// node nothing more than its stream. Authentication is the admin secret's
// (auth.go): a node serves the console beyond loopback only with TLS and
// the secret (the CLI enforces it; Config.Validate checks what it can).
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Source is what the console shows, read from a node.
type Source interface {
	// Sample is the node's state now: cheap (the console calls it once per
	// interval), with at most lines hot lines.
	Sample(lines int) Sample
	// Key is one key's report, as `ticketing inspect` prints it.
	Key(key string) (wire.KeyReport, error)
	// Revoke ends the holding of key under token on an operator's word
	// (cluster.Node.Revoke): by names the operator, reason says why. It
	// needs the leader: elsewhere it answers wire.ErrNotLeader (naming
	// the leader), unless the source forwards it there.
	Revoke(ctx context.Context, key string, token uint64, by, reason string) (wire.RevokeReport, error)
}

// Sample is one reading of a node, the unit of the console's stream.
type Sample struct {
	// AtUnixMs is the node's wall clock when it was taken.
	AtUnixMs int64 `json:"at_unix_ms"`
	// ServerID, Role, Serving, Term, Leader, ClusterID, Domain and
	// ClusterVersion are as in `ticketing status` (wire.StatusReport).
	ServerID       string `json:"server_id"`
	Role           string `json:"role"`
	Serving        bool   `json:"serving"`
	Term           uint64 `json:"term"`
	Leader         string `json:"leader"`
	ClusterID      string `json:"cluster_id"`
	Domain         string `json:"domain"`
	ClusterVersion uint16 `json:"cluster_version"`
	// CommitIndex and AppliedIndex are Raft's; the page derives the apply
	// rate from AppliedIndex's growth between samples.
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	// KeysHeld, Waiters, Permits (held permits of semaphores) and
	// LastToken (the token high-water mark: its growth between samples is
	// the grant rate) are from the node's applied state.
	KeysHeld  int    `json:"keys_held"`
	Waiters   int    `json:"waiters"`
	Permits   int    `json:"permits"`
	LastToken uint64 `json:"last_token"`
	// Commit is the latency from a batch's proposal to its apply on this
	// node, over the batches of the last interval (leader only; N 0: none).
	Commit Latency `json:"commit"`
	// Members is the Raft configuration, sorted by server id.
	Members []Member `json:"members"`
	// Lines are the longest lines of the table, longest first.
	Lines []Line `json:"lines"`
	// SessionsTotal counts the sidecars' sessions; Sessions lists the
	// first MaxSessions.
	SessionsTotal int       `json:"sessions_total"`
	Sessions      []Session `json:"sessions"`
}

// Latency sums up the durations of one interval.
type Latency struct {
	N     int     `json:"n"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// Member is one server of the configuration.
type Member struct {
	ID       string `json:"id"`
	PeerAddr string `json:"peer_addr"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
}

// Line is one of the hottest lines: a key with its waiters.
type Line struct {
	Key     string `json:"key"`
	Waiters int    `json:"waiters"`
	// Semaphore: a semaphore key's permit line; Permits its n and Held
	// the permits held.
	Semaphore bool   `json:"semaphore,omitempty"`
	Permits   uint32 `json:"permits,omitempty"`
	Held      int    `json:"held,omitempty"`
	// Holder, Label, Token and HeldMs describe a lock key's holder (none
	// when reserved for a block).
	Holder string `json:"holder,omitempty"`
	Label  string `json:"label,omitempty"`
	Token  uint64 `json:"token,omitempty"`
	HeldMs int64  `json:"held_ms,omitempty"`
	// HandoffsPerSec is the key's recent hand-off rate (the pace its
	// waiters' estimates use); 0 while unknown (fewer than two hand-offs,
	// or not the leader).
	HandoffsPerSec float64 `json:"handoffs_per_sec"`
}

// Session is one sidecar's session, as `ticketing status` lists it.
type Session struct {
	ID       string `json:"id"`
	Waiters  int    `json:"waiters"`
	Holdings int    `json:"holdings"`
	// Attached: a connection of the session is attached to this leader
	// (nil: this node does not lead).
	Attached *bool  `json:"attached,omitempty"`
	Resumes  uint64 `json:"resumes"`
}

// Limits of a sample.
const (
	// MaxLines is the most hot lines a sample lists.
	MaxLines = 20
	// MaxSessions is the most sessions a sample lists.
	MaxSessions = 50
)

// Config configures a Console.
type Config struct {
	// Source is the node the console shows. Required.
	Source Source
	// Interval is the time between two samples (and two frames of every
	// stream). Zero: DefaultInterval.
	Interval time.Duration
	// History is how many samples a page gets when it connects. Zero:
	// DefaultHistory.
	History int
	// Secret, when set, is the admin secret the page must be given once
	// (auth.go); nil serves the page to anyone who reaches it, which the
	// CLI allows only on a loopback address.
	Secret []byte
	// SecureCookie marks the session cookie Secure (served over TLS).
	SecureCookie bool
	// Now is the clock of the session cookies' expiry; nil: time.Now.
	Now func() time.Time
	// Logger hears refused logins; nil: slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultInterval = time.Second
	DefaultHistory  = 120
)

// DefaultConfig returns a Config with its defaults, for source.
func DefaultConfig(source Source) Config {
	return Config{Source: source, Interval: DefaultInterval, History: DefaultHistory}
}

// Validate reports a Config that cannot run.
func (c Config) Validate() error {
	switch {
	case c.Source == nil:
		return errors.New("console: no Source")
	case c.Interval < 0 || (c.Interval > 0 && c.Interval < 50*time.Millisecond) || c.Interval > time.Minute:
		return fmt.Errorf("console: Interval %v: want 50ms..1m (0: %v)", c.Interval, DefaultInterval)
	case c.History < 0 || c.History > 3600:
		return fmt.Errorf("console: History %d: want 0..3600 (0: %d)", c.History, DefaultHistory)
	case c.Secret != nil && len(c.Secret) < 16:
		return fmt.Errorf("console: Secret of %d bytes: want at least 16", len(c.Secret))
	}
	return nil
}

//go:embed assets
var assets embed.FS

// Console samples its Source and serves the page and its stream.
type Console struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// history is the last cfg.History samples as JSON, oldest first.
	history [][]byte
	// subs are the streams' channels; a slow stream misses samples (its
	// channel holds one) rather than slowing the others.
	subs map[chan []byte]struct{}
	// leader is the leader the last sample named (a revoke refused for
	// not leading names it).
	leader string

	// csrfKey keys the revoke's CSRF tokens when there is no Secret.
	csrfKey []byte
}

// New returns a Console; Run samples its source.
func New(cfg Config) (*Console, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.History == 0 {
		cfg.History = DefaultHistory
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand does not fail
	return &Console{cfg: cfg, log: log, subs: map[chan []byte]struct{}{}, csrfKey: key}, nil
}

// Run samples the source every interval until ctx ends.
func (c *Console) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		c.sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample takes one sample and sends it to every stream.
func (c *Console) sample() {
	smp := c.cfg.Source.Sample(MaxLines)
	b, err := json.Marshal(smp)
	if err != nil {
		c.log.Error("console: a sample does not encode", "err", err) // a bug: every field is plain
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader = smp.Leader
	if len(c.history) == c.cfg.History {
		copy(c.history, c.history[1:])
		c.history = c.history[:len(c.history)-1]
	}
	c.history = append(c.history, b)
	for ch := range c.subs {
		select {
		case ch <- b:
		default: // it has not taken the last one yet: it gets the next
		}
	}
}

// subscribe returns the history so far and a channel of the samples to
// come; cancel ends it.
func (c *Console) subscribe() (history [][]byte, ch chan []byte, cancel func()) {
	ch = make(chan []byte, 1)
	c.mu.Lock()
	history = append([][]byte(nil), c.history...)
	c.subs[ch] = struct{}{}
	c.mu.Unlock()
	return history, ch, func() {
		c.mu.Lock()
		delete(c.subs, ch)
		c.mu.Unlock()
	}
}

// Handler serves the console: the page and its assets, the stream
// (/api/events), one key (/api/keys/KEY), the revoke (POST /api/revoke,
// with the CSRF token of GET /api/csrf; revoke.go) and, with a Secret,
// the login.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets") // cannot fail: the directory is embedded
	files := http.FileServerFS(static)
	mux.Handle("GET /{$}", c.page(files))
	mux.Handle("GET /app.js", files)
	mux.Handle("GET /style.css", files)
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.Handle("GET /api/events", c.authed(http.HandlerFunc(c.events)))
	mux.Handle("GET /api/keys/{key...}", c.authed(http.HandlerFunc(c.key)))
	mux.Handle("GET /api/csrf", c.authed(http.HandlerFunc(c.csrf)))
	mux.Handle("POST /api/revoke", c.authed(http.HandlerFunc(c.revoke)))
	return securityHeaders(mux)
}

// securityHeaders: the page loads nothing from elsewhere and runs no
// inline script, and no other site may frame it.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// page serves index.html to a logged-in browser, else sends it to the
// login.
func (c *Console) page(files http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.allowed(r) {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		files.ServeHTTP(w, r)
	})
}

// events is the stream: the history, then a sample per interval, as
// server-sent events of one JSON sample each.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	history, ch, cancel := c.subscribe()
	defer cancel()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no") // a proxy in front must not hold the stream
	for _, b := range history {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return
		}
	}
	fl.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case b := <-ch:
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// key serves one key's report as JSON.
func (c *Console) key(w http.ResponseWriter, r *http.Request) {
	rep, err := c.cfg.Source.Key(r.PathValue("key"))
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, locksm.ErrInvalidKey) {
			code = http.StatusBadRequest
		}
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(rep)
}
