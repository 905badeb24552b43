package httpserve

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// Listener wraps ln so that the refusals net/http writes itself, before any
// handler runs (a head it cannot parse, a Transfer-Encoding it does not
// support, headers past MaxHeaderBytes), reach the client as
// application/problem+json, as every other refusal of the lab does, instead
// of net/http's plain text.
func Listener(ln net.Listener) net.Listener { return refusalListener{ln} }

type refusalListener struct{ net.Listener }

func (l refusalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return refusalConn{c}, nil
}

type refusalConn struct{ net.Conn }

// Write sends net/http's own refusal as a problem; it writes each one whole,
// in one call, straight to the connection, then closes it. A handler's
// answer never matches: net/http gives those a Date header.
func (c refusalConn) Write(b []byte) (int, error) {
	p, ok := refusal(b)
	if !ok {
		return c.Conn.Write(b)
	}
	body := p.Response().Body
	if _, err := fmt.Fprintf(c.Conn, "HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		p.Status, http.StatusText(p.Status), len(body), body); err != nil {
		return 0, err
	}
	return len(b), nil
}

// plainRefusal is what net/http writes between the status line and the
// text of a refusal of its own.
const plainRefusal = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// refusal reads one of net/http's refusals as the problem the lab answers.
func refusal(b []byte) (lab.Problem, bool) {
	rest, ok := bytes.CutPrefix(b, []byte("HTTP/1.1 "))
	if !ok {
		return lab.Problem{}, false
	}
	// Only the status line is read before the check: every answer of a
	// handler passes here too.
	end := bytes.IndexByte(rest, '\r')
	if end < 3 || !bytes.HasPrefix(rest[end:], []byte(plainRefusal)) {
		return lab.Problem{}, false
	}
	statusLine, text := rest[:end], rest[end+len(plainRefusal):]
	status, err := strconv.Atoi(string(statusLine[:3]))
	if err != nil || status < 400 {
		return lab.Problem{}, false
	}
	switch status {
	case http.StatusNotImplemented: // the only 501 net/http writes itself
		return lab.Problem{Status: http.StatusBadRequest, Code: "unsupported_transfer_encoding", Title: "Unsupported transfer encoding",
			Param: "Transfer-Encoding", Detail: "Transfer-Encoding names a coding this lab does not accept; send the body with a Content-Length header"}, true
	case http.StatusRequestHeaderFieldsTooLarge:
		return lab.Problem{Status: status, Code: "headers_too_large", Title: http.StatusText(status),
			Detail: fmt.Sprintf("the request's headers are over %d bytes", MaxHeaderBytes)}, true
	}
	detail := strings.TrimPrefix(string(text), string(statusLine)+": ")
	return lab.Problem{Status: status, Code: "bad_request", Title: http.StatusText(status), Detail: detail}, true
}
