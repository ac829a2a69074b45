// Placeholder until the OpenSSL transport lands: TLS is refused with a clear message.
#include "redcount/errors.h"
#include "redcount/options.h"
#include "redcount/redis/transport.h"

namespace redcount {

class TlsContext {};

std::shared_ptr<TlsContext> make_tls_context(const StoreOptions&) {
  throw InvalidArgument("TLS (rediss://) is not built into this redcount yet");
}

std::unique_ptr<Transport> make_tls_transport(int, std::shared_ptr<TlsContext>, const std::string&) {
  throw InvalidArgument("TLS (rediss://) is not built into this redcount yet");
}

}  // namespace redcount
