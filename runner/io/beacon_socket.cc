#include "runner/io/beacon_socket.h"

#include <sys/random.h>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>

#include "base/hex.h"

namespace ddprun::io {

namespace asio = boost::asio;
using boost::system::error_code;

struct BeaconSocket::Impl {
  explicit Impl(asio::io_context& io) : socket(io) {}
  asio::ip::udp::socket socket;
  asio::ip::udp::endpoint sender;
  // One byte more than a beacon can be: a longer datagram is seen as too long, not cut.
  std::array<char, core::kMaxBeaconSize + 1> buffer{};
  std::function<void(const core::Beacon&)> on_beacon;
};

BeaconSocket::BeaconSocket(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BeaconSocket::~BeaconSocket() {
  error_code ignored;
  impl_->socket.close(ignored);
}

Result<std::unique_ptr<BeaconSocket>> BeaconSocket::Open(asio::io_context& io,
                                                         std::function<void(const core::Beacon&)> on_beacon) {
  std::array<uint8_t, 16> random{};
  if (::getrandom(random.data(), random.size(), 0) != static_cast<ssize_t>(random.size())) {
    return Fail("cannot read randomness for the progress token");
  }
  auto impl = std::make_unique<Impl>(io);
  impl->on_beacon = std::move(on_beacon);
  error_code ec;
  impl->socket.open(asio::ip::udp::v4(), ec);
  if (!ec) impl->socket.bind({asio::ip::make_address_v4("127.0.0.1"), 0}, ec);
  if (ec) return Fail(fmt::format("cannot open the progress socket on 127.0.0.1: {}", ec.message()));
  const uint16_t port = impl->socket.local_endpoint(ec).port();
  if (ec) return Fail(fmt::format("cannot read the progress socket's port: {}", ec.message()));
  std::unique_ptr<BeaconSocket> socket(new BeaconSocket(std::move(impl)));
  socket->address_ = fmt::format("127.0.0.1:{}", port);
  socket->token_ = HexEncode(std::string_view(reinterpret_cast<const char*>(random.data()), random.size()));
  socket->Receive();
  return socket;
}

void BeaconSocket::Receive() {
  impl_->socket.async_receive_from(
      asio::buffer(impl_->buffer), impl_->sender, [this](const error_code& ec, size_t size) {
        if (ec == asio::error::operation_aborted) return;
        if (!ec) {
          auto beacon = core::ParseBeacon(std::string_view(impl_->buffer.data(), size), token_);
          if (beacon) {
            impl_->on_beacon(*beacon);
          } else {
            ++dropped_;
          }
        }
        Receive();
      });
}

}  // namespace ddprun::io
