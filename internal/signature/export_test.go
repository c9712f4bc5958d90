package signature

import (
	"fmt"
	"time"
)

// SignBody returns body as provider would send it at ts, signed with
// o.Secrets[0], for schemes whose signature lives in the body (mailgun,
// msgraph). Tests only; the CLI uses SignDelivery.
func SignBody(provider string, o Options, body []byte, ts time.Time) ([]byte, error) {
	s, err := build(provider, o)
	if err != nil {
		return nil, err
	}
	bs, ok := s.(bodySigner)
	if !ok {
		return nil, fmt.Errorf("provider %s signs in headers: use Sign", provider)
	}
	return bs.signBody(body, ts)
}
