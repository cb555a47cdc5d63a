// relokv_server's HTTP layer (http.hpp): the server, its listeners and their accept loops; one
// connection's session is in http_session.hpp.
#include "http_session.hpp"

namespace relokv_server::http {

using detail::session;

std::string request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, name)) return v;
  return {};
}

void server::impl::accept(listener& l) {
  l.acceptor.async_accept(net::make_strand(ioc), [this, &l](const error_code& ec, tcp::socket s) {
    if (!l.acceptor.is_open() || ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors (or another transient failure): try again shortly, never spin.
      auto t = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
      t->async_wait([this, &l, t](const error_code&) { accept(l); });
      return;
    }
    error_code e;
    const auto ep = s.remote_endpoint(e);
    const std::string peer = e ? std::string("?") : ep.address().to_string();
    if (draining || !admit(peer)) {
      s.close(e);  // over a connection limit (counted), or no longer accepting
    } else {
      s.set_option(tcp::no_delay(true), e);
      if (l.tls)
        std::make_shared<session<beast::ssl_stream<beast::tcp_stream>>>(
            *this, l, beast::ssl_stream<beast::tcp_stream>(beast::tcp_stream(std::move(s)), *l.tls),
            peer)
            ->start();
      else
        std::make_shared<session<beast::tcp_stream>>(*this, l, beast::tcp_stream(std::move(s)),
                                                     peer)
            ->start();
    }
    accept(l);
  });
}

server::server(limits l, int workers) : impl_(std::make_unique<impl>(l, workers)) {}

server::~server() { stop(); }

void server::route(std::string method, std::string path, handler h, bool offload) {
  impl_->routes.push_back({std::move(method), std::move(path), std::move(h), offload});
}

int server::listen(const std::string& host, int port, const tls_files& tls,
                   std::vector<std::string> routes_allowed, std::string name) {
  try {
    auto l = std::make_unique<impl::listener>(impl::listener{
        tcp::acceptor(impl_->ioc), nullptr, std::move(routes_allowed), std::move(name)});
    if (tls.enabled()) {
      l->tls = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
      l->tls->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                          net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                          net::ssl::context::no_tlsv1_1);
      l->tls->use_certificate_chain_file(tls.cert_file);
      l->tls->use_private_key_file(tls.key_file, net::ssl::context::pem);
    }
    const tcp::endpoint ep(net::ip::make_address(host), static_cast<unsigned short>(port));
    l->acceptor.open(ep.protocol());
    l->acceptor.set_option(net::socket_base::reuse_address(true));
    l->acceptor.bind(ep);
    l->acceptor.listen(net::socket_base::max_listen_connections);
    const int bound = l->acceptor.local_endpoint().port();
    impl_->listeners.push_back(std::move(l));
    impl_->accept(*impl_->listeners.back());
    return bound;
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) +
                             (tls.enabled() ? " with TLS" : "") + ": " + e.what());
  }
}

void server::start() {
  impl_->guard.emplace(impl_->ioc.get_executor());
  impl_->io_thread = std::thread([this] { impl_->ioc.run(); });
}

void server::drain() {
  impl_->draining = true;
  net::post(impl_->ioc, [this] {
    for (auto& l : impl_->listeners) {
      error_code ignored;
      l->acceptor.close(ignored);
    }
  });
}

void server::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  impl_->guard.reset();
  impl_->ioc.stop();
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
  impl_->workers.stop();
  impl_->workers.join();
  // Sessions still answering hold themselves: let go (outside the lock: a session may end
  // here, and withdraws itself).
  std::vector<std::function<void()>> abandon;
  {
    const std::lock_guard lock(impl_->live_mu);
    for (auto& [id, f] : impl_->live) abandon.push_back(f);
  }
  for (auto& f : abandon) f();
}

int server::answering() const { return impl_->answering.load(); }

counters server::stats() const {
  const std::lock_guard lock(impl_->mu);
  return impl_->c;
}

}  // namespace relokv_server::http
