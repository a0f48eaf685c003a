package testdb

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy stands between a test's pool and the test database and injects the
// faults a real network and a real server produce: every connection cut at
// once (a failover, a proxy restart), the database unreachable for a while,
// a route blackholed (nothing forwarded, nothing closed, nothing answered,
// as when a network partition drops packets), and a connection lost while
// COMMIT is in flight — with the COMMIT reaching the server (it commits,
// the client never hears) or not (it does not).
//
// It forwards bytes unchanged and parses just enough of the client's side of
// PostgreSQL's protocol to see a COMMIT: the startup message, then typed
// messages (a byte of type, a length). Connections go over Unix sockets, as
// the test database's do.
type Proxy struct {
	dir    string
	target string // the database's socket path
	ln     net.Listener

	mu       sync.Mutex
	down     bool
	closed   bool
	conns    map[*proxyConn]bool
	onCommit CommitFault
	refused  int
	// hole is open (not closed) while the route is blackholed: every
	// forwarding, dial and close waits on it; Heal closes it.
	hole    chan struct{}
	held    int          // connections accepted while blackholed
	stalled atomic.Int32 // forwardings (and dials) waiting on the blackhole now
	wg      sync.WaitGroup
}

// CommitFault says what the proxy does to the next COMMIT it sees.
type CommitFault int

const (
	// PassCommit forwards COMMIT as any other message.
	PassCommit CommitFault = iota
	// CutAfterCommit forwards the next COMMIT to the server and then cuts
	// the client's connection before the answer: the transaction commits
	// and the client cannot know.
	CutAfterCommit
	// CutBeforeCommit cuts the client's connection instead of forwarding
	// the next COMMIT: the server rolls the transaction back, and the
	// client cannot know either.
	CutBeforeCommit
)

type proxyConn struct {
	client, server net.Conn
	// swallow is set when a COMMIT was forwarded that the client must not
	// hear the answer to: the server's messages are read and dropped up to
	// its next ReadyForQuery, and then the connection is cut.
	swallow atomic.Bool
}

// StartProxy starts a proxy to the test database and returns it with the
// URL a pool connects to it with. It is closed when the test ends.
func StartProxy(tb testing.TB) (*Proxy, string) {
	tb.Helper()
	u, err := url.Parse(URL(tb))
	if err != nil {
		tb.Fatalf("parse %s: %v", EnvURL, err)
	}
	q := u.Query()
	host, port := q.Get("host"), q.Get("port")
	if host == "" || !strings.HasPrefix(host, "/") {
		tb.Skipf("the fault proxy needs the test database on a Unix socket (host=/dir in %s); it is %q", EnvURL, host)
	}
	if port == "" {
		port = "5432"
	}
	dir, err := os.MkdirTemp("", "arbor-proxy")
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, ".s.PGSQL."+port))
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{dir: dir, target: filepath.Join(host, ".s.PGSQL."+port), ln: ln, conns: map[*proxyConn]bool{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	q.Set("host", dir)
	u.RawQuery = q.Encode()
	return p, u.String()
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Heal()
	_ = p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	_ = os.RemoveAll(p.dir)
}

// Blackhole stops forwarding in both directions without closing anything:
// bytes already sent stay unanswered, a connection either side closes is
// not closed on the other, and a new connection is accepted but not
// forwarded (it reaches the server at Heal). It is what a client sees of a
// partition that drops packets: no error, only silence, until its own
// timeouts fire. The server side is as silent: it learns nothing of the
// clients until Heal (its own timeouts, such as
// idle_in_transaction_session_timeout, still end its sessions).
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole == nil {
		p.hole = make(chan struct{})
	}
}

// Heal ends a blackhole: what was held is forwarded, in order, and what
// either side closed meanwhile is closed on the other.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole != nil {
		close(p.hole)
		p.hole = nil
	}
}

// Held counts the connections accepted while the route was blackholed.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Stalled counts what waits on the blackhole now: messages held in either
// direction, dials of connections accepted meanwhile, closes.
func (p *Proxy) Stalled() int { return int(p.stalled.Load()) }

// waitHole waits while the route is blackholed.
func (p *Proxy) waitHole() {
	p.mu.Lock()
	hole := p.hole
	p.mu.Unlock()
	if hole != nil {
		p.stalled.Add(1)
		<-hole
		p.stalled.Add(-1)
	}
}

// CutAll closes every connection through the proxy, as a failover does.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.client.Close()
		_ = c.server.Close()
		delete(p.conns, c)
	}
}

// Down cuts every connection and refuses new ones (they are closed as soon
// as they are accepted) until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	p.CutAll()
}

// Up lets connections through again.
func (p *Proxy) Up() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Refused counts the connections refused while the proxy was down: a
// client retrying shows up here.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// OnNextCommit arms a fault for the next COMMIT of any connection.
func (p *Proxy) OnNextCommit(f CommitFault) {
	p.mu.Lock()
	p.onCommit = f
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down, holed := p.down, p.hole != nil
		if down {
			p.refused++
		}
		if holed {
			p.held++
		}
		p.mu.Unlock()
		if down {
			_ = client.Close()
			continue
		}
		if holed {
			// Accepted, but not forwarded until Heal: the client's startup
			// message waits unanswered.
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.waitHole()
				p.connect(client)
			}()
			continue
		}
		p.connect(client)
	}
}

// connect dials the server for an accepted client and forwards between
// them.
func (p *Proxy) connect(client net.Conn) {
	server, err := net.Dial("unix", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &proxyConn{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = client.Close()
		_ = server.Close()
		return
	}
	p.conns[c] = true
	p.mu.Unlock()
	p.wg.Add(2)
	go p.clientToServer(c)
	go p.serverToClient(c)
}

// drop closes both sides of a connection one side ended — once the route
// is not blackholed: a blackhole closes nothing.
func (p *Proxy) drop(c *proxyConn) {
	p.waitHole()
	_ = c.client.Close()
	_ = c.server.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// clientToServer forwards the client's messages, watching for COMMIT.
func (p *Proxy) clientToServer(c *proxyConn) {
	defer p.wg.Done()
	// After a COMMIT forwarded for CutAfterCommit, serverToClient cuts the
	// connection once the server has answered it: closing the server's
	// socket here, with its answers unread, would reset the connection and
	// could beat the COMMIT to the server (a flaky "committed" fault).
	handedOver := false
	defer func() {
		if !handedOver {
			p.drop(c)
		}
	}()
	// The startup message has no type byte: a length, then the body.
	var head [4]byte
	if _, err := io.ReadFull(c.client, head[:]); err != nil {
		return
	}
	n := int(binary.BigEndian.Uint32(head[:]))
	if n < 4 || n > 1<<20 {
		return
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(c.client, body); err != nil {
		return
	}
	p.waitHole()
	if _, err := c.server.Write(append(head[:], body...)); err != nil {
		return
	}
	for {
		var h [5]byte
		if _, err := io.ReadFull(c.client, h[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(h[1:]))
		if n < 4 || n > 1<<30 {
			return
		}
		msg := make([]byte, n-4)
		if _, err := io.ReadFull(c.client, msg); err != nil {
			return
		}
		fault := PassCommit
		if isCommit(h[0], msg) {
			p.mu.Lock()
			fault, p.onCommit = p.onCommit, PassCommit
			p.mu.Unlock()
		}
		if fault == CutBeforeCommit {
			return
		}
		if fault == CutAfterCommit {
			// The server commits; the client never hears: serverToClient
			// drops its answer and then cuts the connection.
			c.swallow.Store(true)
		}
		p.waitHole()
		if _, err := c.server.Write(append(h[:], msg...)); err != nil {
			return
		}
		if fault == CutAfterCommit {
			handedOver = true
			return // stop reading the client; serverToClient cuts
		}
	}
}

// serverToClient forwards the server's messages, dropping them (and then
// cutting the connection) once swallow is set and the server is ready
// again after the COMMIT.
func (p *Proxy) serverToClient(c *proxyConn) {
	defer p.wg.Done()
	defer p.drop(c)
	for {
		var h [5]byte
		if _, err := io.ReadFull(c.server, h[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(h[1:]))
		if n < 4 || n > 1<<30 {
			return
		}
		msg := make([]byte, n-4)
		if _, err := io.ReadFull(c.server, msg); err != nil {
			return
		}
		if c.swallow.Load() {
			if h[0] == 'Z' {
				return
			}
			continue
		}
		p.waitHole()
		if _, err := c.client.Write(append(h[:], msg...)); err != nil {
			return
		}
	}
}

// isCommit reports whether a client message is a COMMIT: a simple query
// ('Q'), or a parse ('P') of the statement, as pgx may send it.
func isCommit(typ byte, msg []byte) bool {
	var sql string
	switch typ {
	case 'Q':
		sql = string(bytes.TrimRight(msg, "\x00"))
	case 'P':
		// name\0 query\0 ...
		parts := bytes.SplitN(msg, []byte{0}, 3)
		if len(parts) < 2 {
			return false
		}
		sql = string(parts[1])
	default:
		return false
	}
	sql = strings.ToLower(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(sql), ";")))
	return sql == "commit" || sql == "commit transaction" || sql == "end"
}

// String describes the proxy, for failure messages.
func (p *Proxy) String() string {
	return fmt.Sprintf("fault proxy %s -> %s", p.dir, p.target)
}
