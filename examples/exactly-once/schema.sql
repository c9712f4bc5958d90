-- The legacy application's tables, in the same database as the gateway's
-- events table (any schema): complete_by upstream needs the order, the
-- e-mail and the claim to commit together.
CREATE TABLE IF NOT EXISTS orders (
	id                text PRIMARY KEY,
	payment_intent_id text UNIQUE NOT NULL,
	status            text NOT NULL DEFAULT 'pending',
	paid_at           timestamptz
);

-- The confirmation e-mails a worker sends later (a transactional outbox):
-- a row per e-mail queued. A webhook handled twice queues two.
CREATE TABLE IF NOT EXISTS email_outbox (
	id       bigserial PRIMARY KEY,
	order_id text NOT NULL REFERENCES orders (id),
	template text NOT NULL,
	queued_at timestamptz NOT NULL DEFAULT now()
);

-- When the application connects with its own role (not the gateway's), it
-- may run the commit function once the gateway has created it:
--   GRANT USAGE ON SCHEMA public TO app;
--   GRANT EXECUTE ON FUNCTION webhook_events_commit(text) TO app;
