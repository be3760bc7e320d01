// The vendor key profiles of [[route]] profile: what each vendor's public
// documentation says it dedupes on and for how long (README, "Vendor
// profiles", cites each source). A window is given only where the
// documentation states one.
#include <algorithm>

#include "idem/config.h"

namespace idem {
namespace {

constexpr int64_t kHour = 3'600'000;

}  // namespace

const std::vector<VendorProfile>& VendorProfiles() {
  static const std::vector<VendorProfile> profiles = {
      // "Adyen ... Idempotency keys are valid for a minimum period of 7 days after first
      // submission."
      {"adyen", "Adyen", "Idempotency-Key", "", Duration(7 * 24 * kHour),
       "https://docs.adyen.com/development-resources/api-idempotency"},
      // "By default, keys expire after 24 hours for both the sandbox and production
      // environments."
      {"checkout", "Checkout.com", "Cko-Idempotency-Key", "", Duration(24 * kHour),
       "https://checkout.com/docs/payments/manage-payments/retry-a-payment"},
      // Orders v2: "The server stores keys for 6 hours" (up to 72 h on request); other PayPal
      // APIs state their own period in their reference.
      {"paypal", "PayPal", "PayPal-Request-Id", "", Duration(6 * kHour),
       "https://developer.paypal.com/api/orders/v2/"},
      // A body field; Square does not publish how long it keeps a key.
      {"square", "Square", "", "idempotency_key", std::nullopt,
       "https://developer.squareup.com/docs/working-with-apis/idempotency"},
      // "You can remove keys from the system automatically after they're at least 24 hours
      // old."
      {"stripe", "Stripe", "Idempotency-Key", "", Duration(24 * kHour),
       "https://docs.stripe.com/idempotency"},
  };
  return profiles;
}

const VendorProfile* FindVendorProfile(std::string_view name) {
  const auto& all = VendorProfiles();
  auto it = std::find_if(all.begin(), all.end(),
                         [name](const VendorProfile& p) { return p.name == name; });
  return it == all.end() ? nullptr : &*it;
}

}  // namespace idem
