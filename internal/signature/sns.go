package signature

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1" //nolint:gosec // SignatureVersion 1 is SHA1withRSA, as AWS signs it
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch"
)

// AWS SNS HTTP(S) deliveries carry their signature in the JSON body:
// Signature (base64 RSA) over "<Name>\n<value>\n" for each signed field
// present, in AWS's order — Message, MessageId, Subject, Timestamp,
// TopicArn, Type for a Notification; Message, MessageId, SubscribeURL,
// Timestamp, Token, TopicArn, Type for a SubscriptionConfirmation and an
// UnsubscribeConfirmation — with SHA1withRSA (SignatureVersion 1) or
// SHA256withRSA (2), checked with the certificate at SigningCertURL,
// fetched only from https://sns.<region>.amazonaws.com[.cn]/…pem.
// Source: AWS, "Verifying the signatures of Amazon SNS messages" (Doc) and
// "Parsing message formats"
// (https://docs.aws.amazon.com/sns/latest/dg/sns-message-and-json-formats.html).
//
// A valid SNS signature proves only that some SNS topic sent the message,
// and anyone can create one: the configured secrets are the topic ARNs the
// route accepts, checked before any certificate is fetched. The two
// subscription messages are the handshake: verified like a delivery, never
// claimed, and forwarded to the upstream, which confirms by visiting
// SubscribeURL (checked here to be an SNS host, so a verified message
// cannot point the upstream elsewhere). The message ID is signed and stays
// the same on SNS's retries. The official AWS library sns-validator is the
// oracle.
func init() {
	subscription := func(typ string) Challenge {
		return Challenge{
			Name: typ, Method: http.MethodPost, BodyField: "Type", BodyValue: typ,
			Auth: AuthSignature, Answer: AnswerForward,
		}
	}
	register(Preset{ //nolint:gosec // G101: SecretFormat describes a secret, holds none
		Name:         "sns",
		SecretFormat: "the topic ARN(s) the route accepts; the key is the certificate at SigningCertURL",
		Delivery: Delivery{
			Retry:   Retry{Retries: true, Attempts: 4, Note: "default policy: 3 retries 20 s apart after server-side errors; an HTTP/S delivery policy may set more, at most 3,600 s in all", Source: "https://docs.aws.amazon.com/sns/latest/dg/sns-message-delivery-retries.html"},
			MaxBody: MaxBody{Bytes: 256 << 10, Note: "the published message; the JSON envelope adds its fields, signature and URLs", Source: "https://docs.aws.amazon.com/sns/latest/api/API_Publish.html"},
			Timeout: Timeout{Source: Undocumented},
			Answer:  Answer{Source: Undocumented},
			Refusal: Refusal{Note: "retries follow server-side errors only: a 4xx refusal is not retried", Source: "https://docs.aws.amazon.com/sns/latest/dg/sns-message-delivery-retries.html"},
		},
		Doc:             "https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html",
		SignatureHeader: "none: body Signature, SignatureVersion 1|2, SigningCertURL",
		EventID:         ids(jsonID("MessageId")),
		IDStability:     StabilityStable,
		Oracle:          "sns-validator",
		Challenges:      []Challenge{subscription("SubscriptionConfirmation"), subscription("UnsubscribeConfirmation")},
		covers:          snsCovers,
		Scheme: Scheme{
			Signed:    "Name\\nvalue\\n of the signed fields, certificate from SigningCertURL",
			Algorithm: "rsa-sha1|rsa-sha256",
			Encoding:  "base64",
		},
		build: buildSNS,
	})
}

// snsCerts fetches SNS signing certificates: one SNS host per region, in
// the commercial and China partitions.
var snsCerts = keyfetch.New(keyfetch.Policy{
	Hosts:    []string{"sns.*.amazonaws.com", "sns.*.amazonaws.com.cn"},
	MaxBytes: 16 << 10,
})

var (
	snsNotificationFields = []string{"Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"}
	snsSubscriptionFields = []string{"Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"}
)

type sns struct {
	topics []string
	key    crypto.Signer // for signBody
	now    func() time.Time
}

func buildSNS(_ Preset, o Options) (signer, error) {
	topics, key, err := settings(o)
	if err != nil {
		return nil, err
	}
	for i, t := range topics {
		if !strings.HasPrefix(t, "arn:aws") || strings.Count(t, ":") != 5 {
			return nil, fmt.Errorf("secret %d is not an SNS topic ARN (arn:aws:sns:<region>:<account>:<topic>)", i+1)
		}
	}
	v := &sns{topics: topics, key: key, now: o.Now}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

// snsFields reads the message's string fields, each at most once.
func snsFields(body []byte) (map[string]string, error) {
	if !isJSONObject(body) {
		return nil, fmt.Errorf("body is not an SNS message: %w", ErrMissingHeader)
	}
	if _, ok := topMember(body, "Signature"); !ok {
		if gjson.GetBytes(body, "Signature").Exists() {
			return nil, fmt.Errorf("member Signature given twice: %w", ErrMalformedHeader)
		}
		return nil, fmt.Errorf("body has no Signature: %w", ErrMissingHeader)
	}
	f := map[string]string{}
	for _, name := range []string{"Type", "Message", "MessageId", "Subject", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Signature", "SignatureVersion", "SigningCertURL"} {
		v, ok := topMember(body, name)
		switch {
		case !ok && gjson.GetBytes(body, name).Exists():
			return nil, fmt.Errorf("member %s given twice: %w", name, ErrMalformedHeader)
		case !ok || (name == "Subject" && v.Type == gjson.Null):
			continue
		case v.Type != gjson.String:
			return nil, fmt.Errorf("%s is not a string: %w", name, ErrMalformedHeader)
		}
		f[name] = v.Str
	}
	return f, nil
}

func (v *sns) Verify(body []byte, h http.Header) error {
	f, err := snsFields(body)
	if err != nil {
		return err
	}
	var fields []string
	switch f["Type"] {
	case "Notification":
		fields = snsNotificationFields
	case "SubscriptionConfirmation", "UnsubscribeConfirmation":
		fields = snsSubscriptionFields
		u, err := url.Parse(f["SubscribeURL"])
		if err != nil || u.Scheme != "https" || snsCerts.Allowed(f["SubscribeURL"]) != nil {
			return fmt.Errorf("SubscribeURL is not an https SNS URL: %w", ErrMalformedHeader)
		}
	default:
		return fmt.Errorf("unknown message Type: %w", ErrMalformedHeader)
	}
	for _, name := range fields {
		if _, ok := f[name]; !ok && name != "Subject" {
			return fmt.Errorf("signed field %s is missing: %w", name, ErrMalformedHeader)
		}
	}
	if mt := h.Get("X-Amz-Sns-Message-Type"); mt != "" && mt != f["Type"] {
		return fmt.Errorf("x-amz-sns-message-type differs from Type: %w", ErrMalformedHeader)
	}
	var hash crypto.Hash
	switch f["SignatureVersion"] {
	case "1":
		hash = crypto.SHA1
	case "2":
		hash = crypto.SHA256
	default:
		return fmt.Errorf("SignatureVersion is not 1 or 2: %w", ErrMalformedHeader)
	}
	sig, err := base64.StdEncoding.DecodeString(f["Signature"])
	if err != nil || len(sig) < 128 || len(sig) > 1024 {
		return fmt.Errorf("member Signature is not a base64 RSA signature: %w", ErrMalformedHeader)
	}
	certURL := f["SigningCertURL"]
	if u, err := url.Parse(certURL); err != nil || !strings.HasSuffix(u.Path, ".pem") || u.RawQuery != "" {
		return fmt.Errorf("SigningCertURL is not a .pem URL: %w", ErrMalformedHeader)
	}
	topicOK := false
	for _, t := range v.topics {
		topicOK = topicOK || t == f["TopicArn"]
	}
	if !topicOK {
		// Checked before the fetch: a message from a topic the route does
		// not accept costs no request to AWS.
		return fmt.Errorf("TopicArn is not a configured topic (%d configured): %w", len(v.topics), ErrNoMatchingSignature)
	}
	if err := snsCerts.Allowed(certURL); err != nil {
		return fetchErr("SigningCertURL", err)
	}
	raw, err := snsCerts.Get(certURL)
	if err != nil {
		return fetchErr("SNS certificate", err)
	}
	cert, err := parseCertPEM(raw, v.now())
	if err != nil {
		return fmt.Errorf("SNS certificate: %s: %w", err, ErrKeyUnavailable)
	}
	pub, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok {
		return fmt.Errorf("SNS certificate: not an RSA key: %w", ErrKeyUnavailable)
	}
	if rsa.VerifyPKCS1v15(pub, hash, snsDigest(hash, snsStringToSign(f, fields)), sig) != nil {
		return fmt.Errorf("the message signature does not verify: %w", ErrNoMatchingSignature)
	}
	return nil
}

// snsCovers is Preset.Covered of SNS: the signed fields, not the JSON
// around them (spacing, member order, the unsigned members).
func snsCovers(body []byte, _ http.Header) []byte {
	f, err := snsFields(body)
	if err != nil {
		return body
	}
	fields := snsSubscriptionFields
	if f["Type"] == "Notification" {
		fields = snsNotificationFields
	}
	return []byte("sns:" + snsStringToSign(f, fields))
}

func snsStringToSign(f map[string]string, fields []string) string {
	var b strings.Builder
	for _, name := range fields {
		if val, ok := f[name]; ok {
			b.WriteString(name + "\n" + val + "\n")
		}
	}
	return b.String()
}

func snsDigest(hash crypto.Hash, s string) []byte {
	if hash == crypto.SHA1 {
		d := sha1.Sum([]byte(s)) //nolint:gosec // SignatureVersion 1
		return d[:]
	}
	d := sha256.Sum256([]byte(s))
	return d[:]
}

// signBody writes Signature (version 2, or the SignatureVersion already in
// body), SigningCertURL and the first topic (when body has none) into body;
// the certificate is published at SigningCertURL (keyfetch.Publish).
func (v *sns) signBody(body []byte, ts time.Time) ([]byte, error) {
	if v.key == nil {
		return nil, errors.New("signing needs a private key: secret <topic ARN>|<base64 PKCS#8 key> (NewSigningSecret)")
	}
	if !gjson.GetBytes(body, "Message").Exists() {
		// Not an SNS message yet: wrap it as SNS does a published message,
		// with a message ID derived from it (the same event, the same ID).
		sum := sha256.Sum256(body)
		id := hex.EncodeToString(sum[:16])
		if v := gjson.GetBytes(body, "MessageId"); v.Type == gjson.String {
			id = v.Str
		}
		env, err := json.Marshal(map[string]string{"Type": "Notification", "MessageId": id, "Message": string(body)})
		if err != nil {
			return nil, err
		}
		body = env
	}
	var err error
	set := func(name, val string) {
		if err == nil {
			body, err = sjson.SetBytes(body, name, val)
		}
	}
	if !gjson.GetBytes(body, "TopicArn").Exists() {
		set("TopicArn", v.topics[0])
	}
	if !gjson.GetBytes(body, "Timestamp").Exists() {
		set("Timestamp", ts.UTC().Format("2006-01-02T15:04:05.000Z"))
	}
	if !gjson.GetBytes(body, "Type").Exists() {
		set("Type", "Notification")
	}
	version := gjson.GetBytes(body, "SignatureVersion").Str
	if version == "" {
		version = "2"
	}
	certPEM, cerr := selfSigned(v.key, "sns.amazonaws.com", ts)
	if cerr != nil {
		return nil, cerr
	}
	certURL := "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-" + keyID(v.key.Public()) + ".pem"
	keyfetch.Publish(certURL, certPEM)
	set("SignatureVersion", version)
	set("SigningCertURL", certURL)
	set("Signature", "")
	if err != nil {
		return nil, err
	}
	f, err := snsFields(body)
	if err != nil {
		return nil, err
	}
	fields := snsNotificationFields
	if f["Type"] != "Notification" {
		fields = snsSubscriptionFields
	}
	hash := crypto.SHA256
	if version == "1" {
		hash = crypto.SHA1
	}
	sig, err := v.key.Sign(rand.Reader, snsDigest(hash, snsStringToSign(f, fields)), hash)
	if err != nil {
		return nil, err
	}
	return sjson.SetBytes(body, "Signature", base64.StdEncoding.EncodeToString(sig))
}

// sign refers to signBody: the signature lives in the body.
func (v *sns) sign([]byte, http.Header, time.Time) error {
	return errors.New("sns signs inside the body: use SignDelivery")
}
