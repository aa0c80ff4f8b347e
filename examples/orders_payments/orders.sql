-- The orders service's own table. An order is 'placed' with its OrderPlaced event in the same
-- transaction, and becomes 'paid' when the payments service's PaymentCaptured arrives.
CREATE TABLE IF NOT EXISTS orders (
    order_id    text PRIMARY KEY,
    customer_id text NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    currency    text NOT NULL,
    status      text NOT NULL DEFAULT 'placed' CHECK (status IN ('placed', 'paid')),
    payment_id  text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
