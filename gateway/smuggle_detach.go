package gateway

import "time"

// A hijacked connection (the WebSocket route) no longer carries HTTP/1
// requests, so the smuggling guard has nothing left to follow; yet its
// follower goroutine, its 4 KiB buffer and a copy of every byte the
// client sends stayed for the connection's life (~6 MiB at 1,000
// WebSocket subscribers, issue 25). detach ends the follower and lets
// Read read the connection itself:
//
//  1. guardConnState (StateHijacked) stops the inspection (stopInspecting:
//     every held byte is released to out, later ones pass through) and
//     calls detach, which marks the guard detaching and kicks the
//     follower out of a blocked read with a read deadline in the past;
//  2. the follower, wherever it was (the parser, a body, passThrough),
//     ends up in passThrough, which keeps what the kicked read returned
//     and calls finishDetach instead of reading on;
//  3. finishDetach restores the server's own read deadline on the
//     connection and switches Read to direct: once out is drained (the
//     bytes read before, in order), Read reads the connection, and
//     SetReadDeadline sets the connection's deadline.
//
// mu orders detach and finishDetach, so the past deadline is never set
// after the server's deadline was restored. A kicked read's timeout is
// never reported to the server: the follower only records errors other
// than the kick.

// detach starts ending the follower of a hijacked connection.
func (c *guardConn) detach() {
	c.mu.Lock()
	if !c.direct && !c.closed {
		c.detaching.Store(true)
		_ = c.Conn.SetReadDeadline(time.Unix(1, 0)) // wakes the follower's read
	}
	c.mu.Unlock()
	wake(c.space) // a follower waiting for the server to read
}

// finishDetach hands the connection's reads to Read (the follower's last
// step).
func (c *guardConn) finishDetach() {
	c.mu.Lock()
	_ = c.Conn.SetReadDeadline(c.deadline)
	c.direct = true
	c.mu.Unlock()
	wake(c.ready)
}
