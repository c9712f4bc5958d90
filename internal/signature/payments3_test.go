package signature_test

const (
	// midtransBody is a Midtrans notification without its signature_key.
	midtransBody = `{"transaction_time":"2025-12-01 07:00:00","transaction_status":"settlement","transaction_id":"513f1f01-c9da-474c-9fc9-d5c64364b709","status_code":"200","payment_type":"credit_card","order_id":"order-RT-1","gross_amount":"10000.00","currency":"IDR"}`
	// braintreeXML is a Braintree notification before base64.
	braintreeXML = `<notification><timestamp type="datetime">2025-12-01T00:00:00Z</timestamp><kind>subscription_charged_successfully</kind><subject><subscription><id>sub_RT_1</id></subscription></subject></notification>`
)
