package labtest

import (
	"io"
	"net"
	"testing"
	"time"
)

// DripEvery is the pace of SlowClient: a byte every 50ms.
const DripEvery = 50 * time.Millisecond

// SlowClient opens a connection to addr, sends head, then one byte of drip
// every DripEvery (nothing more when drip is ""), as a client that sends
// slowly or never finishes, and reports on the channel whether the server
// closed the connection within limit. The wait is on the close itself;
// only the client's pace is timed.
func SlowClient(tb testing.TB, addr, head, drip string, limit time.Duration) <-chan bool {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := io.WriteString(conn, head); err != nil {
		conn.Close()
		tb.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, conn) // returns when the server closes
		close(closed)
	}()
	go func() { // the client's pace
		for i := 0; drip != ""; i++ {
			t := time.NewTimer(DripEvery)
			select {
			case <-closed:
				t.Stop()
				return
			case <-t.C:
			}
			if _, err := conn.Write([]byte{drip[i%len(drip)]}); err != nil {
				return
			}
		}
	}()
	out := make(chan bool, 1)
	go func() {
		defer conn.Close()
		t := time.NewTimer(limit)
		defer t.Stop()
		select {
		case <-closed:
			out <- true
		case <-t.C:
			out <- false
			conn.Close()
			<-closed
		}
	}()
	return out
}

// FreePorts returns n distinct loopback ports that were free a moment ago.
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer ln.Close() // held until all are picked, so they differ
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
