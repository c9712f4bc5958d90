package signature

import (
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Cloudinary's default notification signature is SHA-1.
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"time"
)

// Cloudinary notifications: X-Cld-Signature, the hex SHA-1 (or SHA-256,
// when the account's signature algorithm is set to it) of the body, the
// X-Cld-Timestamp header (Unix seconds) and the API secret, concatenated.
// It is a plain hash, not an HMAC, so the engine cannot express it; the
// digest's length tells the two algorithms apart. cloudinary's
// utils.verifyNotificationSignature accepts a timestamp up to 7,200 s old,
// which is this preset's tolerance (in both directions). Notifications name
// an asset, not an event: configure an event ID.
func init() {
	register(Preset{ //nolint:gosec // SecretFormat describes the secret; it holds none
		Name:             "cloudinary",
		SecretFormat:     "the account's API secret",
		Delivery:         allUndocumented,
		Doc:              "https://cloudinary.com/documentation/notification_signatures",
		SignatureHeader:  "X-Cld-Signature: <hex> (with X-Cld-Timestamp)",
		DefaultTolerance: 2 * time.Hour,
		Oracle:           "cloudinary",
		Scheme: Scheme{
			Headers:   []HeaderSet{{Signature: "X-Cld-Signature", Timestamp: "X-Cld-Timestamp"}},
			Signed:    "none: SHA-1 (or SHA-256) of {body}{timestamp}<api secret>, not an HMAC",
			Algorithm: "sha1",
			Encoding:  "hex",
		},
		build: func(p Preset, o Options) (signer, error) {
			tolerance, now := clock(p, o)
			v := &cloudinaryVerifier{tolerance: tolerance, now: now}
			for _, s := range o.Secrets {
				v.secrets = append(v.secrets, []byte(s))
			}
			return v, nil
		},
	})
}

type cloudinaryVerifier struct {
	secrets   [][]byte
	tolerance time.Duration
	now       func() time.Time
}

const (
	cldSig = "X-Cld-Signature"
	cldTS  = "X-Cld-Timestamp"
)

func (v *cloudinaryVerifier) Verify(body []byte, h http.Header) error {
	raw, ts, err := signedAt(h, cldSig, cldTS)
	if err != nil {
		return err
	}
	var newHash func() hash.Hash
	switch len(raw) {
	case 2 * sha1.Size:
		newHash = sha1.New
	case 2 * sha256.Size:
		newHash = sha256.New
	default:
		return fmt.Errorf("header %s is not a hex SHA-1 or SHA-256 digest: %w", cldSig, ErrMalformedHeader)
	}
	sig, err := hex.DecodeString(raw)
	if err != nil {
		return fmt.Errorf("header %s is not a hex SHA-1 or SHA-256 digest: %w", cldSig, ErrMalformedHeader)
	}
	if err := checkTimestamp(ts, time.Second, v.tolerance, v.now()); err != nil {
		return err
	}
	for _, secret := range v.secrets {
		if hmac.Equal(cloudinaryDigest(newHash, body, ts, secret), sig) {
			return nil
		}
	}
	return fmt.Errorf("%s: checked against %d secret(s): %w", cldSig, len(v.secrets), ErrNoMatchingSignature)
}

func (v *cloudinaryVerifier) sign(body []byte, h http.Header, ts time.Time) error {
	text := strconv.FormatInt(ts.Unix(), 10)
	h.Set(cldTS, text)
	h.Set(cldSig, hex.EncodeToString(cloudinaryDigest(sha1.New, body, text, v.secrets[0])))
	return nil
}

// cloudinaryDigest is the hash of body, timestamp and secret, in that order.
func cloudinaryDigest(newHash func() hash.Hash, body []byte, ts string, secret []byte) []byte {
	d := newHash()
	d.Write(body)
	d.Write([]byte(ts))
	d.Write(secret)
	return d.Sum(nil)
}
