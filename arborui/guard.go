package arborui

import (
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
)

// The handler's defences against other sites: the Host a request names
// (DNS rebinding), the origin of a POST (cross-site requests) and the
// address an action sends the browser back to (open redirects). None of
// them is authentication: the handler authenticates nobody.

// hostAllowed says whether r names a host the handler serves: an IP
// literal, localhost (or a name under .localhost), or one of
// Options.AllowedHosts. A page of evil.example whose name an attacker
// made resolve to 127.0.0.1 (DNS rebinding) reaches the handler with
// Host: evil.example, and is refused before it can read a page or its
// action token. An IP literal cannot be rebound: a page is of the origin
// its address names.
func (h *handler) hostAllowed(r *http.Request) bool {
	if h.anyHost {
		return true
	}
	host := strings.ToLower(r.Host)
	if host == "" {
		return false
	}
	name := host
	if n, _, err := net.SplitHostPort(host); err == nil {
		name = n
	}
	name = strings.TrimSuffix(name, ".")
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return true
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	return h.hosts[host] || h.hosts[name]
}

// sameOrigin says whether r comes from a page of the handler's own origin,
// by what browsers send: Sec-Fetch-Site, else Origin, else Referer. A
// request with none of them is not from a browser (which sends Origin with
// every POST), and carries the token or fails anyway. (The Host it is
// compared with has passed hostAllowed.)
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	from := r.Header.Get("Origin")
	if from == "" {
		from = r.Header.Get("Referer")
	}
	if from == "" {
		return true
	}
	u, err := url.Parse(from)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// localPath returns to as a path of the handler's own (under prefix), fit
// for a Location header, or "" when it is not one. A browser reads
// "/\t/evil.example/" as "//evil.example/" (it drops tabs and line
// breaks from addresses) and "/\\evil.example" as "//evil.example": an
// address with a control character, a space or a backslash is refused
// outright, and what is left must parse as a path with no scheme and no
// host that does not start with two slashes.
func localPath(prefix, to string) string {
	if to == "" || strings.ContainsFunc(to, func(c rune) bool { return c <= ' ' || c == '\\' || c == 0x7f }) {
		return ""
	}
	u, err := url.Parse(to)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || u.User != nil {
		return ""
	}
	// Cleaned, so that "/arbor/../x" is not taken for a path under /arbor.
	clean := path.Clean(u.Path)
	if strings.HasSuffix(u.Path, "/") && clean != "/" {
		clean += "/"
	}
	if !strings.HasPrefix(clean, prefix+"/") || strings.HasPrefix(clean, "//") {
		return ""
	}
	p := (&url.URL{Path: clean}).EscapedPath()
	if u.RawQuery != "" {
		p += "?" + u.RawQuery
	}
	return p
}
