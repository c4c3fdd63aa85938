package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Authentication. With a Secret (the node's admin secret), the page asks
// for it once: POST /login checks it and sets the session cookie, which
// holds an expiry and an HMAC-SHA256 of it under the secret, never the
// secret itself. The cookie is HttpOnly (no script reads it) and
// SameSite=Strict (no other site's page sends it, so no other site can
// drive the console's requests), and Secure when served over TLS.

// cookieName is the session cookie's name.
const cookieName = "ticketing_console"

// SessionTTL is how long a login lasts.
const SessionTTL = 12 * time.Hour

// mac is the session cookie's HMAC of its expiry (Unix seconds).
func (c *Console) mac(expiry int64) string {
	m := hmac.New(sha256.New, c.cfg.Secret)
	m.Write([]byte("ticketing console session\x00" + strconv.FormatInt(expiry, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// allowed reports whether r may see the console: no secret is set, or it
// carries a session cookie that is ours and not expired.
func (c *Console) allowed(r *http.Request) bool {
	if c.cfg.Secret == nil {
		return true
	}
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return false
	}
	exp, mac, ok := strings.Cut(ck.Value, ".")
	if !ok {
		return false
	}
	expiry, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || c.cfg.Now().Unix() >= expiry {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(c.mac(expiry)))
}

// authed answers 401 to a request without a session.
func (c *Console) authed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.allowed(r) {
			http.Error(w, "log in first: the console needs the admin secret", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loginPage serves the login form (or the console, with no secret set).
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Secret == nil || c.allowed(r) {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	b, _ := assets.ReadFile("assets/login.html") // embedded: cannot fail
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(b)
}

// maxSecretLen bounds what a login may post (the admin secret file holds
// 32 bytes of hex; longer is not a secret of ours).
const maxSecretLen = 1024

// login checks the posted secret and sets the session cookie.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Secret == nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxSecretLen+64)
	given := strings.TrimSpace(r.PostFormValue("secret"))
	if subtle.ConstantTimeCompare([]byte(given), c.cfg.Secret) != 1 {
		c.log.Warn("console: a login with a wrong secret", "remote", r.RemoteAddr)
		time.Sleep(200 * time.Millisecond) // a guesser pays for each try
		http.Redirect(w, r, "/login?wrong=1", http.StatusSeeOther)
		return
	}
	expiry := c.cfg.Now().Add(SessionTTL).Unix()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: strconv.FormatInt(expiry, 10) + "." + c.mac(expiry), Path: "/",
		MaxAge: int(SessionTTL / time.Second), HttpOnly: true, Secure: c.cfg.SecureCookie, SameSite: http.SameSiteStrictMode})
	c.log.Info("console: logged in", "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}
