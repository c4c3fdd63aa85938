package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// The revoke: the console is read-only but for this one change, which
// the page asks the operator to confirm, with a reason, before it sends
// POST /api/revoke {"key", "token", "reason"}. The request must come from
// the console's own page:
//
//   - a session (the login's cookie, as every /api/ request), else 401;
//   - POST only (the mux answers 405 to any other method);
//   - a JSON body (Content-Type application/json: another site's form
//     cannot send one without a CORS preflight the console never grants);
//   - not cross-site: Sec-Fetch-Site, when the browser sends it, is
//     same-origin, and Origin, when sent, is this host; else 403;
//   - the CSRF token in the X-Console-CSRF header, else 403: an HMAC of
//     the session cookie under the admin secret (so it changes with every
//     login and is worth nothing without the cookie), which the page reads
//     from GET /api/csrf (same-origin only: no other site can read it).
//
// The revoke is made by "console:" and the remote host (the operator's
// address as the node sees it), in the replicated audit record.

// CSRFHeader is the header that carries the revoke's CSRF token.
const CSRFHeader = "X-Console-CSRF"

// revokeTimeout bounds a revoke's wait for its commit.
const revokeTimeout = 10 * time.Second

// csrfToken is the CSRF token of r's session.
func (c *Console) csrfToken(r *http.Request) string {
	key, session := c.csrfKey, ""
	if c.cfg.Secret != nil {
		key = c.cfg.Secret
		if ck, err := r.Cookie(cookieName); err == nil {
			session = ck.Value
		}
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ticketing console csrf\x00" + session))
	return hex.EncodeToString(m.Sum(nil))
}

// sameOrigin reports whether r comes from the console's own page, as far
// as the browser tells (a client that sends neither header is no
// browser: it still needs the session and the CSRF token).
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return false
		}
	}
	return true
}

// csrf serves the session's CSRF token to the console's page.
func (c *Console) csrf(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, "forbidden", "cross-site request", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"token": c.csrfToken(r)})
}

// RevokeRequest is POST /api/revoke's body. Token is a JSON number or a
// string of digits (a page's numbers are exact to 2^53 only).
type RevokeRequest struct {
	Key    string      `json:"key"`
	Token  json.Number `json:"token"`
	Reason string      `json:"reason"`
}

// RevokeReply is POST /api/revoke's answer: the revoke's audit record
// (with the next holder's token, if a waiter was granted), or an error
// with its code (the unix API's names: not_held, token_mismatch,
// invalid_reason, ...; not_leader with the leader this node knows;
// indeterminate: proposed, outcome unknown, see the key's last revoke).
type RevokeReply struct {
	Revoked *wire.RevokeReport `json:"revoked,omitempty"`
	Error   string             `json:"error,omitempty"`
	Code    string             `json:"code,omitempty"`
	Leader  string             `json:"leader,omitempty"`
}

func writeError(w http.ResponseWriter, status int, code, msg, leader string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(RevokeReply{Error: msg, Code: code, Leader: leader})
}

// revoke serves POST /api/revoke.
func (c *Console) revoke(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.log.Warn("console: a cross-site revoke refused", "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"),
			"sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
		writeError(w, http.StatusForbidden, "forbidden", "cross-site request", "")
		return
	}
	if got := r.Header.Get(CSRFHeader); !hmac.Equal([]byte(got), []byte(c.csrfToken(r))) {
		c.log.Warn("console: a revoke without its CSRF token refused", "remote", r.RemoteAddr, "given", got != "")
		writeError(w, http.StatusForbidden, "forbidden", "missing or wrong CSRF token: reload the page", "")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "bad_request", "send the revoke as application/json", "")
		return
	}
	var req RevokeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "a revoke is {\"key\", \"token\", \"reason\"}: "+err.Error(), "")
		return
	}
	token, err := strconv.ParseUint(req.Token.String(), 10, 64)
	if err != nil || token == 0 {
		writeError(w, http.StatusBadRequest, "bad_request", "a revoke names the token of the holding it ends", "")
		return
	}
	if strings.TrimSpace(req.Reason) == "" {
		writeError(w, http.StatusBadRequest, "invalid_reason", "a revoke from the console says why (a reason)", "")
		return
	}
	by := ByOf(r.RemoteAddr)
	ctx, cancel := context.WithTimeout(r.Context(), revokeTimeout)
	rep, err := c.cfg.Source.Revoke(ctx, req.Key, token, by, req.Reason)
	cancel()
	c.log.Warn("console revoke", "remote", r.RemoteAddr, "key", req.Key, "token", token, "by", by, "reason", req.Reason,
		"ok", err == nil, "err", err)
	if err != nil {
		status, code, leader := revokeStatus(err)
		if code == "not_leader" {
			c.mu.Lock()
			leader = c.leader
			c.mu.Unlock()
		}
		writeError(w, status, code, err.Error(), leader)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(RevokeReply{Revoked: &rep})
}

// revokeStatus maps a revoke's error to its HTTP status and code.
func revokeStatus(err error) (status int, code, leader string) {
	switch {
	case errors.Is(err, wire.ErrNotLeader):
		return http.StatusMisdirectedRequest, "not_leader", ""
	case errors.Is(err, wire.ErrIndeterminate):
		return http.StatusGatewayTimeout, "indeterminate", ""
	case errors.Is(err, locksm.ErrNotHeld), errors.Is(err, locksm.ErrTokenMismatch):
		return http.StatusConflict, wire.CodeOf(err).String(), ""
	case errors.Is(err, wire.ErrNotSupported):
		return http.StatusNotImplemented, wire.CodeOf(err).String(), ""
	case errors.Is(err, locksm.ErrInvalidReason), errors.Is(err, locksm.ErrInvalidKey), errors.Is(err, locksm.ErrInvalidOwner),
		errors.Is(err, wire.ErrBadRequest):
		return http.StatusBadRequest, wire.CodeOf(err).String(), ""
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusGatewayTimeout, "indeterminate", ""
	}
	return http.StatusInternalServerError, "internal", ""
}

// ByOf is the revoke's "by" for a console request from remote (the
// request's RemoteAddr): "console:" and the host, in the owners' alphabet
// (printable ASCII without spaces; anything else becomes '_'), at most
// locksm.MaxOwnerLen bytes.
func ByOf(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	if host == "" {
		host = "unknown"
	}
	b := []byte("console:" + host)
	for i, ch := range b {
		if ch < 0x21 || ch > 0x7e {
			b[i] = '_'
		}
	}
	if len(b) > locksm.MaxOwnerLen {
		b = b[:locksm.MaxOwnerLen]
	}
	return string(b)
}
