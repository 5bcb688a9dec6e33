package quicpeer

import "time"

// Crash ends the listener's QUIC transport and closes its UDP socket
// without a CONNECTION_CLOSE on any connection: to the peers it looks like
// a killed process. Test-only.
func (l *Listener) Crash() {
	_ = l.tr.Close()
	_ = l.udp.Close()
}

// QUICTimers returns the QUIC idle timeout and PING period a Config gets
// in role r. Test-only.
func QUICTimers(c Config, r Role) (idle, ping time.Duration, err error) {
	cfg, err := resolve(c)
	if err != nil {
		return 0, 0, err
	}
	q := quicConfig(cfg, r)
	return q.MaxIdleTimeout, q.KeepAlivePeriod, nil
}
