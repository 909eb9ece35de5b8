package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
)

// Cross-site request forgery: every form carries a token, the HMAC (under
// the handler's own random key) of a random value the browser holds in a
// cookie that only this dashboard's paths see (SameSite=Strict, HttpOnly).
// A POST must bring both, and they must agree: another site can make the
// browser send the cookie, never read it or the token. A browser's
// Sec-Fetch-Site and Origin headers, when sent, must also say the request
// comes from the dashboard's own origin.

const (
	csrfCookie = "dq_dashboard_csrf"
	csrfField  = "csrf"
)

// csrfKey signs the tokens.
type csrfKey []byte

func newCSRFKey() csrfKey {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return k
}

// token is the form token of a cookie value.
func (k csrfKey) token(cookie string) string {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(cookie))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// formToken returns the token for the forms of a page, setting the cookie
// it is tied to when the browser has none.
func (k csrfKey) formToken(w http.ResponseWriter, r *http.Request, prefix string) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) >= 20 {
		return k.token(c.Value)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	value := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: value, Path: prefix + "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	return k.token(value)
}

// errForbidden is why an action was refused; the page does not say more.
var errForbidden = errors.New("this action was refused: reload the page and try again from it")

// check refuses a POST that does not come from one of the dashboard's own
// forms.
func (k csrfKey) check(r *http.Request) error {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		// The browser says the page that sent it is ours; its Origin may
		// name a host that a reverse proxy rewrote on the way here.
	case "":
		if err := sameHost(r); err != nil {
			return err
		}
	default:
		return errForbidden
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return errForbidden
	}
	if !hmac.Equal([]byte(r.PostFormValue(csrfField)), []byte(k.token(c.Value))) {
		return errForbidden
	}
	return nil
}

// sameHost refuses a request whose Origin, when sent, names another host
// than the request's: the check for browsers that send no Sec-Fetch-Site.
func sameHost(r *http.Request) error {
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return errForbidden
		}
	}
	return nil
}
