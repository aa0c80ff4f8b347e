-- The payments service's own table. One payment per order: the unique order_id is the
-- business rule, the inbox's dedupe is what keeps a redelivered OrderPlaced from even trying.
CREATE TABLE IF NOT EXISTS payments (
    payment_id  text PRIMARY KEY,
    order_id    text NOT NULL UNIQUE,
    customer_id text NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    currency    text NOT NULL,
    captured_at timestamptz NOT NULL DEFAULT now()
);
