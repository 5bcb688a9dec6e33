package main

import (
	"os"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const redeemHelp = `Redeem a claim check issued for a DEFERRED entity: the peer resumes the
entity, exactly once. Prints the claim as JSON. A replayed claim fails with
FailedPrecondition CLAIM_ALREADY_REDEEMED, an expired one with CLAIM_EXPIRED,
one whose document ended first (CANCELLED) with CLAIM_CANCELLED.

Example:
  gateway redeem 1234567890123456789`

func runRedeem(args []string) int {
	fs := newFlags("redeem", "gateway redeem [flags] CLAIM_ID", redeemHelp)
	cf := addClientFlags(fs)
	if code, ok := fs.parse(args); !ok {
		return code
	}
	id, ok := oneArg(fs, "CLAIM_ID")
	if !ok {
		return 2
	}
	c, err := cf.dial()
	if err != nil {
		return fail(os.Stderr, "redeem", err)
	}
	defer c.Close()
	claim, err := c.docs.RedeemClaimCheck(c.ctx, &gatewayv1.RedeemClaimCheckRequest{ClaimId: id})
	if err != nil {
		return fail(os.Stderr, "redeem", rpcError(err))
	}
	if err := printJSON(claim); err != nil {
		return fail(os.Stderr, "redeem", err)
	}
	return 0
}
