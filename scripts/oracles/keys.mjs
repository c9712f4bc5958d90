// Vectors of the presets verified with the provider's public keys (see
// internal/signature/fetched.go), each from the provider's official library:
// AWS SNS (sns-validator, AWS's own), Google Pub/Sub push tokens
// (google-auth-library) and Apple App Store Server Notifications V2
// (@apple/app-store-server-library). A vector's `publish` lists what the local key
// server must serve while it is verified ({key, body}, as keyfetch.Publish
// takes them: a certificate at its URL, a JWK added to Google's key set).
// Certificates are made with the openssl CLI (node:crypto cannot issue
// one); keys are generated on each run, so a re-run changes these vectors.
//
// sns-validator signs an UnsubscribeConfirmation over the Notification
// field list, where AWS's documentation (and the preset) use the
// subscription list with Token: no vector covers that message type.
//
// PayPal's official Node SDK (paypal-rest-sdk) verifies by posting the
// delivery to PayPal's API, which cannot run offline: paypal is
// documentation only.

import crypto from 'node:crypto';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import { EventEmitter } from 'node:events';
import os from 'node:os';
import path from 'node:path';

// selfSigned returns a PEM certificate for a key pair, valid from 2025 to
// 2035 so that the vectors' clock falls inside (`openssl ca -selfsign`:
// `openssl req -x509` cannot set the start date before OpenSSL 3.4).
function selfSigned(privateKey, cn) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'oracle-cert-'));
  const run = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  try {
    fs.writeFileSync(path.join(dir, 'key.pem'), privateKey.export({ type: 'pkcs8', format: 'pem' }));
    fs.writeFileSync(path.join(dir, 'ca.cnf'), '[ca]\ndefault_ca=CA\n[CA]\ndatabase=index.txt\nnew_certs_dir=.\nserial=serial\n' +
      'default_md=sha256\npolicy=p\nunique_subject=no\n[p]\ncommonName=supplied\n');
    fs.writeFileSync(path.join(dir, 'index.txt'), '');
    fs.writeFileSync(path.join(dir, 'serial'), crypto.randomBytes(8).toString('hex') + '\n');
    run('req', '-new', '-key', 'key.pem', '-subj', `/CN=${cn}`, '-out', 'csr.pem');
    run('ca', '-batch', '-config', 'ca.cnf', '-selfsign', '-keyfile', 'key.pem', '-in', 'csr.pem',
      '-startdate', '20250101000000Z', '-enddate', '20350101000000Z', '-notext', '-out', 'cert.pem');
    return fs.readFileSync(path.join(dir, 'cert.pem'), 'utf8');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// withCertificates answers sns-validator's https.get of a certificate URL
// from certs (url -> PEM), 404 for any other, without a network.
async function withCertificates(certs, fn) {
  const real = https.get;
  https.get = (url, cb) => {
    const res = new EventEmitter();
    const req = new EventEmitter();
    const pem = certs[String(url)];
    res.statusCode = pem ? 200 : 404;
    process.nextTick(() => {
      cb(res);
      if (pem) res.emit('data', Buffer.from(pem));
      res.emit('end');
    });
    return req;
  };
  try {
    return await fn();
  } finally {
    https.get = real;
  }
}

const b64u = (b) => Buffer.from(b).toString('base64url');

// appleChain issues, with openssl, a root, an intermediate and a leaf on
// P-256 keys, shaped as Apple's App Store chain: the intermediate a CA
// with Apple's marker 1.2.840.113635.100.6.2.1, the leaf with the receipt
// marker 1.2.840.113635.100.6.11.1 (markers false leaves them out), valid
// 2025-2035. Returns the PEMs and the leaf's private key.
function appleChain({ leafMarker = true } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'oracle-apple-'));
  const run = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  const read = (f) => fs.readFileSync(path.join(dir, f), 'utf8');
  try {
    fs.writeFileSync(path.join(dir, 'ca.cnf'), [
      '[ca]', 'default_ca=CA', '[CA]', 'database=index.txt', 'new_certs_dir=.', 'serial=serial', 'default_md=sha256',
      'policy=p', 'unique_subject=no', 'copy_extensions=none', '[p]', 'commonName=supplied',
      '[root]', 'basicConstraints=critical,CA:true', 'keyUsage=critical,keyCertSign,cRLSign',
      '[inter]', 'basicConstraints=critical,CA:true,pathlen:0', 'keyUsage=critical,keyCertSign,cRLSign', '1.2.840.113635.100.6.2.1=DER:0500',
      '[leaf]', 'basicConstraints=critical,CA:false', 'keyUsage=critical,digitalSignature', '1.2.840.113635.100.6.11.1=DER:0500',
      '[plainleaf]', 'basicConstraints=critical,CA:false', 'keyUsage=critical,digitalSignature', '',
    ].join('\n'));
    fs.writeFileSync(path.join(dir, 'index.txt'), '');
    fs.writeFileSync(path.join(dir, 'serial'), crypto.randomBytes(8).toString('hex') + '\n');
    const dates = ['-startdate', '20250101000000Z', '-enddate', '20350101000000Z'];
    for (const n of ['root', 'inter', 'leaf']) {
      run('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', `${n}.key`);
      run('req', '-new', '-key', `${n}.key`, '-subj', `/CN=Oracle ${n}`, '-out', `${n}.csr`);
    }
    run('ca', '-batch', '-config', 'ca.cnf', '-selfsign', '-keyfile', 'root.key', '-in', 'root.csr', '-extensions', 'root', ...dates, '-notext', '-out', 'root.pem');
    run('ca', '-batch', '-config', 'ca.cnf', '-cert', 'root.pem', '-keyfile', 'root.key', '-in', 'inter.csr', '-extensions', 'inter', ...dates, '-notext', '-out', 'inter.pem');
    run('ca', '-batch', '-config', 'ca.cnf', '-cert', 'inter.pem', '-keyfile', 'inter.key', '-in', 'leaf.csr', '-extensions', leafMarker ? 'leaf' : 'plainleaf', ...dates, '-notext', '-out', 'leaf.pem');
    return { root: read('root.pem'), inter: read('inter.pem'), leaf: read('leaf.pem'), key: crypto.createPrivateKey(read('leaf.key')) };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

const derB64 = (pem) => new crypto.X509Certificate(pem).raw.toString('base64');

export async function keyVectors({ add, NOW, NOW_S, version, require }) {
  // ---- AWS SNS: sns-validator MessageValidator.validate.
  {
    const MessageValidator = require('sns-validator');
    const lib = 'sns-validator', ver = version(lib);
    const topic = 'arn:aws:sns:us-east-1:123456789012:oracle-orders';
    const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
    const other = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
    const certURL = 'https://sns.us-east-1.amazonaws.com/SimpleNotificationService-oracle.pem';
    const otherURL = 'https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-oracle-other.pem';
    const certs = { [certURL]: selfSigned(privateKey, 'sns.amazonaws.com'), [otherURL]: selfSigned(other, 'sns.amazonaws.com') };
    const notificationKeys = ['Message', 'MessageId', 'Subject', 'Timestamp', 'TopicArn', 'Type'];
    const subscriptionKeys = ['Message', 'MessageId', 'SubscribeURL', 'Timestamp', 'Token', 'TopicArn', 'Type'];
    // AWS's documented string to sign: "Name\nvalue\n" per signed field present.
    const sign = (m, key = privateKey) => {
      const keys = m.Type === 'Notification' ? notificationKeys : subscriptionKeys;
      const text = keys.filter((k) => k in m).map((k) => `${k}\n${m[k]}\n`).join('');
      const alg = m.SignatureVersion === '1' ? 'RSA-SHA1' : 'RSA-SHA256';
      return { ...m, Signature: crypto.sign(alg, Buffer.from(text), key).toString('base64') };
    };
    const notification = (v, extra = {}) => ({
      Type: 'Notification', MessageId: 'c8e6b1a9-0d4b-5e8f-9a63-oracle' + v, TopicArn: topic, Subject: 'order',
      Message: '{"order":{"amount":1000}}', Timestamp: '2025-12-01T00:00:00.000Z', SignatureVersion: v,
      SigningCertURL: certURL, UnsubscribeURL: 'https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe', ...extra,
    });
    const how = "signed with AWS's documented string to sign (node:crypto), verified with MessageValidator.validate (certificates served locally)";
    const cases = [
      ['valid, SignatureVersion 1', sign(notification('1')), true],
      ['valid, SignatureVersion 2', sign(notification('2')), true],
      ['valid, no Subject', sign((({ Subject, ...m }) => m)(notification('2'))), true],
      ['valid SubscriptionConfirmation', sign({
        Type: 'SubscriptionConfirmation', MessageId: '165545c9-2a5c-472c-8df2-7ff2be2b3b1b', Token: '2336412f37fb687f5d51e6e2425',
        TopicArn: topic, Message: 'You have chosen to subscribe to the topic.', SignatureVersion: '2', SigningCertURL: certURL,
        SubscribeURL: 'https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=2336412f37fb687f5d51e6e2425',
        Timestamp: '2025-12-01T00:00:00.000Z',
      }), true],
      ['tampered message', { ...sign(notification('2')), Message: '{"order":{"amount":9000}}' }, false],
      ['tampered message, SignatureVersion 1', { ...sign(notification('1')), Message: '{"order":{"amount":9000}}' }, false],
      ['wrong key', sign(notification('2'), other), false],
      ['certificate of another key', sign(notification('2', { SigningCertURL: otherURL })), false],
      ['bad certificate host', sign(notification('2', { SigningCertURL: 'https://sns.us-east-1.amazonaws.com.evil.example/cert.pem' })), false],
      ['certificate over http', sign(notification('2', { SigningCertURL: 'http://sns.us-east-1.amazonaws.com/SimpleNotificationService-oracle.pem' })), false],
      ['certificate not a .pem', sign(notification('2', { SigningCertURL: 'https://sns.us-east-1.amazonaws.com/cert' })), false],
      ['unknown SignatureVersion', sign(notification('3')), false],
      ['no Signature', (({ Signature, ...m }) => m)(sign(notification('2'))), false],
    ];
    for (const [name, msg, ok] of cases) {
      const b = JSON.stringify(msg);
      await add({
        preset: 'sns', case: name, library: lib, version: ver, how, secrets: [topic], headers: {}, body: b,
        publish: Object.entries(certs).map(([key, body]) => ({ key, body })),
      }, () => withCertificates(certs, () => new Promise((resolve, reject) => {
        new MessageValidator().validate(b, (err) => (err ? reject(err) : resolve(true)));
      })), ok);
    }
  }

  // ---- Google Cloud Pub/Sub push: google-auth-library
  // OAuth2Client.verifySignedJwtWithCertsAsync (the check verifyIdToken runs
  // with Google's keys), issuers accounts.google.com. The library does not
  // check the email claim: every vector carries the configured one.
  {
    const { OAuth2Client } = require('google-auth-library');
    const lib = 'google-auth-library', ver = version(lib);
    const client = new OAuth2Client();
    const email = 'push@oracle-project.iam.gserviceaccount.com';
    const audience = 'https://hooks.example.test/pubsub';
    const { privateKey, publicKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
    const other = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
    const kid = 'oracle-' + crypto.createHash('sha256').update(publicKey.export({ type: 'spki', format: 'der' })).digest('hex').slice(0, 16);
    const jwk = { ...publicKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' };
    const certs = { [kid]: publicKey.export({ type: 'spki', format: 'pem' }) };
    const token = (claims, key = privateKey, header = { alg: 'RS256', kid, typ: 'JWT' }) => {
      const signed = b64u(JSON.stringify(header)) + '.' + b64u(JSON.stringify(claims));
      return signed + '.' + b64u(crypto.sign('sha256', Buffer.from(signed), key));
    };
    const claims = (extra = {}) => ({
      aud: audience, azp: '1234567890', email, email_verified: true, sub: '1234567890',
      iss: 'https://accounts.google.com', iat: NOW_S, exp: NOW_S + 3600, ...extra,
    });
    const b = '{"message":{"attributes":{"k":"v"},"data":"eyJvcmRlciI6MTAwMH0=","messageId":"2070443601311540","publishTime":"2025-12-01T00:00:00.000Z"},"subscription":"projects/p/subscriptions/s"}';
    const how = 'signed as Google signs ID tokens (RS256, node:crypto), verified with OAuth2Client.verifySignedJwtWithCertsAsync (issuers accounts.google.com, the route url as audience)';
    for (const [name, tok, ok] of [
      ['valid', token(claims()), true],
      ['valid, issuer without scheme', token(claims({ iss: 'accounts.google.com' })), true],
      ['valid, expired within the clock skew', token(claims({ iat: NOW_S - 3900, exp: NOW_S - 299 })), true],
      ['wrong key', token(claims(), other), false],
      ['unknown key ID', token(claims(), privateKey, { alg: 'RS256', kid: 'not-googles', typ: 'JWT' }), false],
      ['wrong audience', token(claims({ aud: 'https://other.example.test/pubsub' })), false],
      ['wrong issuer', token(claims({ iss: 'https://evil.example' })), false],
      ['stale: expired', token(claims({ iat: NOW_S - 3901, exp: NOW_S - 301 })), false],
      ['issued in the future', token(claims({ iat: NOW_S + 301, exp: NOW_S + 3901 })), false],
      ['tampered claims', (() => {
        const [h, , s] = token(claims()).split('.');
        return [h, b64u(JSON.stringify(claims({ aud: 'https://other.example.test/pubsub' }))), s].join('.');
      })(), false],
    ]) {
      await add({
        preset: 'pubsub', case: name, library: lib, version: ver, how, secrets: [email], url: audience,
        headers: { Authorization: 'Bearer ' + tok }, body: b,
        publish: [{ key: 'jwks:https://www.googleapis.com/oauth2/v3/certs', body: JSON.stringify(jwk) }],
      }, () => client.verifySignedJwtWithCertsAsync(tok, certs, audience, ['accounts.google.com', 'https://accounts.google.com']), ok);
    }
  }
  // ---- Apple App Store Server Notifications V2: @apple/app-store-server-library
  // SignedDataVerifier.verifyAndDecodeNotification (offline: the chain is
  // checked at the payload's signedDate, as the preset does), the test
  // chain's root as the one trusted root, environment Sandbox.
  {
    const { SignedDataVerifier, Environment } = require('@apple/app-store-server-library');
    const lib = '@apple/app-store-server-library', ver = version(lib);
    const bundle = 'com.example.oracle';
    const trusted = appleChain();
    const foreign = appleChain();
    const unmarked = appleChain({ leafMarker: false });
    const verifier = new SignedDataVerifier([new crypto.X509Certificate(trusted.root).raw], false, Environment.SANDBOX, bundle);
    const payload = (extra = {}, data = {}) => ({
      notificationType: 'DID_RENEW', notificationUUID: '6c3a6c0e-0a2f-4c2b-9a54-0d1f0e4f6a11', version: '2.0',
      signedDate: NOW, data: { bundleId: bundle, environment: 'Sandbox', appAppleId: 1234567890, ...data }, ...extra,
    });
    const jws = (claims, chain = trusted, key = chain.key) => {
      const header = { alg: 'ES256', x5c: [derB64(chain.leaf), derB64(chain.inter), derB64(chain.root)] };
      const signed = b64u(JSON.stringify(header)) + '.' + b64u(JSON.stringify(claims));
      return signed + '.' + b64u(crypto.sign('sha256', Buffer.from(signed), { key, dsaEncoding: 'ieee-p1363' }));
    };
    const how = 'signed as the App Store signs (ES256 JWS with its x5c chain, node:crypto and openssl), verified with SignedDataVerifier.verifyAndDecodeNotification (offline, environment Sandbox)';
    const good = jws(payload());
    const [h, , sig] = good.split('.');
    for (const [name, token, ok] of [
      ['valid', good, true],
      ['tampered payload', [h, b64u(JSON.stringify(payload({ notificationType: 'REFUND' }))), sig].join('.'), false],
      ['wrong key', jws(payload(), trusted, foreign.key), false],
      ['chain to another root', jws(payload(), foreign), false],
      ['leaf without the App Store marker', jws(payload(), unmarked), false],
      ['other bundle ID', jws(payload({}, { bundleId: 'com.example.other' })), false],
      ['other environment', jws(payload({}, { environment: 'Production' })), false],
      ['stale: certificates not yet valid at signedDate', jws(payload({ signedDate: Date.UTC(2024, 0, 1) })), false],
    ]) {
      const b = JSON.stringify({ signedPayload: token });
      await add({
        preset: 'appstore', case: name, library: lib, version: ver, how, secrets: [bundle + ':Sandbox'], headers: {}, body: b,
        publish: [{ key: 'anchor:apple-root-ca-g3', body: trusted.root }],
      }, () => verifier.verifyAndDecodeNotification(token), ok);
    }
  }
}
