"""A legacy Stripe webhook handler (Flask + psycopg 3), made exactly-once.

Behind Caddy's webhook_idempotency with ``complete_by upstream``, each
forwarded delivery carries a ``Webhook-Claim`` header. The handler below is
the legacy code as it was (one transaction: mark the order paid, queue the
confirmation e-mail) plus ONE call, inside that transaction:

    SELECT webhook_events_commit(<the Webhook-Claim header>)

It completes the delivery's claim in the same commit as the order and the
e-mail. When the claim is no longer this delivery's (the gateway gave the
event to a retry because this forward's ending was lost), it raises, so the
order update and the e-mail roll back: the retry does the work, once.

Run (Debian: apt-get install python3-flask python3-psycopg):
    DATABASE_URL=postgres://app@127.0.0.1/shop PORT=9000 python3 payment.py
"""

import os

import psycopg
from flask import Flask, request

app = Flask(__name__)
DSN = os.environ["DATABASE_URL"]


@app.post("/webhooks/stripe")
def stripe_webhook():
    # The gateway verified Stripe's signature before forwarding.
    event = request.get_json(force=True)
    if event.get("type") != "payment_intent.succeeded":
        return "", 200
    intent = event["data"]["object"]["id"]

    # One transaction: committed when the block ends, rolled back if
    # anything in it raises.
    with psycopg.connect(DSN) as conn:
        order = conn.execute(
            "UPDATE orders SET status = 'paid', paid_at = now()"
            " WHERE payment_intent_id = %s RETURNING id",
            (intent,),
        ).fetchone()
        if order is None:
            return "unknown payment intent", 404
        conn.execute(
            "INSERT INTO email_outbox (order_id, template) VALUES (%s, 'payment_confirmation')",
            (order[0],),
        )
        # The one call (complete_by upstream). Never log the header's value.
        conn.execute(
            "SELECT webhook_events_commit(%s)",
            (request.headers.get("Webhook-Claim"),),
        )
    return "", 200


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "9000")))
