package arborui

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
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
	name, port := splitHost(r.Host)
	if name == "" {
		return false
	}
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return true
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	return h.hosts[name] || port != "" && h.hosts[name+":"+port]
}

// splitHost returns the name and the port of a Host header (or of an
// Options.AllowedHosts entry), both as the handler compares them: the name
// lower-cased and without the trailing dot of a fully qualified name
// (ops.example.com. is ops.example.com), the port in decimal without
// leading zeros when it is a number. An IPv6 literal keeps its brackets
// when it had them.
func splitHost(host string) (name, port string) {
	name = strings.ToLower(host)
	if n, p, err := net.SplitHostPort(name); err == nil {
		name, port = n, p
		if strings.Contains(n, ":") {
			name = "[" + n + "]"
		}
	}
	if n, err := strconv.Atoi(port); err == nil && n >= 0 {
		port = strconv.Itoa(n)
	}
	return strings.TrimSuffix(name, "."), port
}

// allowedHost checks an entry of Options.AllowedHosts and returns it
// normalised (see splitHost): "*"; an IP address, bracketed or not when
// IPv6, with an optional port; or a host name — labels of 1 to 63 ASCII
// letters, digits, hyphens (not at a label's ends) and underscores, 253
// bytes at most, with an optional trailing dot — with an optional port
// from 1 to 65535. A name in another script is written in its ASCII
// (xn--) form, which is what a browser sends.
func allowedHost(entry string) (string, error) {
	if entry == "*" {
		return entry, nil
	}
	if entry == "" {
		return "", errors.New("it is empty")
	}
	if strings.ContainsFunc(entry, func(c rune) bool { return c <= ' ' || c >= 0x7f }) {
		return "", errors.New("it holds a space, a control character or a character outside ASCII (write an international name in its xn-- form)")
	}
	name, port, hasPort := entry, "", false
	switch {
	case strings.HasPrefix(entry, "["):
		end := strings.IndexByte(entry, ']')
		if end < 0 {
			return "", errors.New("its [ is not closed")
		}
		name = entry[1:end]
		if a, err := netip.ParseAddr(name); err != nil || !a.Is6() {
			return "", fmt.Errorf("[%s] is not an IPv6 address", name)
		}
		rest := entry[end+1:]
		if rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok {
				return "", fmt.Errorf("%q follows the IPv6 address", rest)
			}
			port, hasPort = p, true
		}
	case strings.Count(entry, ":") > 1:
		// An IPv6 address without brackets (arbor ui's --addr [::]:8080
		// gives "::"): it cannot carry a port.
		if _, err := netip.ParseAddr(entry); err != nil {
			return "", errors.New("it has more than one colon and is not an IPv6 address (write an address with a port as [::1]:8080)")
		}
		return strings.ToLower(entry), nil
	default:
		if n, p, ok := strings.Cut(entry, ":"); ok {
			name, port, hasPort = n, p, true
		}
		if err := checkHostName(name); err != nil {
			return "", err
		}
	}
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || strings.Trim(port, "0123456789") != "" || n < 1 || n > 65535 {
			return "", fmt.Errorf("its port %q is not a number from 1 to 65535", port)
		}
	}
	name, port = splitHost(entry)
	if hasPort {
		return name + ":" + port, nil
	}
	return name, nil
}

// checkHostName checks a host name (or an IPv4 address) of an
// Options.AllowedHosts entry; see allowedHost.
func checkHostName(name string) error {
	if _, err := netip.ParseAddr(name); err == nil {
		return nil
	}
	name = strings.TrimSuffix(name, ".")
	switch {
	case name == "":
		return errors.New("it names no host")
	case len(name) > 253:
		return fmt.Errorf("its name is %d bytes, over the 253 of a host name", len(name))
	}
	for label := range strings.SplitSeq(name, ".") {
		switch {
		case label == "":
			return errors.New("its name has an empty label (two dots, or a dot first)")
		case len(label) > 63:
			return fmt.Errorf("its label %q is %d bytes, over the 63 of a label", label, len(label))
		case label[0] == '-' || label[len(label)-1] == '-':
			return fmt.Errorf("its label %q starts or ends with a hyphen", label)
		case strings.ContainsFunc(label, func(c rune) bool {
			return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_')
		}):
			return fmt.Errorf("its label %q holds a character other than letters, digits, hyphens and underscores", label)
		}
	}
	return nil
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
