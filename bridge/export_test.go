package bridge

import "time"

// SetRedeemAckTimeout shortens redeemAckTimeout for a test; call the
// returned func to restore it. Not safe while a bridge is redeeming.
func SetRedeemAckTimeout(d time.Duration) (restore func()) {
	old := redeemAckTimeout
	redeemAckTimeout = d
	return func() { redeemAckTimeout = old }
}
