// The accept loop of the manager's Asio listeners (guests, admin API), with the file descriptor back-off of
// common::AcceptBackoff. Internal to the manager.
#pragma once

#include <accelpool/common/listener_limits.hpp>

#include <boost/asio/steady_timer.hpp>

#include <utility>

namespace accelpool::manager {

// A listening socket with what its accept loop needs. Lives where its sockets live (one thread at a time).
template <typename Protocol>
struct Listening {
  template <typename Executor>
  Listening(Executor ex, std::string name) : acceptor(ex), retry(ex), backoff(std::move(name)) {}
  typename Protocol::acceptor acceptor;
  boost::asio::steady_timer retry;  // waits out a back-off
  common::AcceptBackoff backoff;
};

// Accepts connections on `l` until its acceptor closes, handing each socket to `on_accept`. Out of file
// descriptors (or kernel memory), it waits AcceptBackoff::kPause before trying again instead of spinning.
// `keep` holds whatever owns `l` alive while an accept or a back-off is pending.
template <typename Protocol, typename Keep, typename OnAccept>
void accept_loop(Listening<Protocol>& l, Keep keep, OnAccept on_accept) {
  l.acceptor.async_accept(
      [lp = &l, keep, on_accept](boost::system::error_code ec, typename Protocol::socket socket) mutable {
        auto& l = *lp;
        if (ec == boost::asio::error::operation_aborted || !l.acceptor.is_open()) return;
        if (!ec) {
          l.backoff.accepted();
          on_accept(std::move(socket));
        } else if (auto pause = l.backoff.failed(ec.value()); pause.count() > 0) {
          l.retry.expires_after(pause);
          l.retry.async_wait([lp, keep, on_accept](boost::system::error_code wec) mutable {
            if (!wec && lp->acceptor.is_open()) accept_loop(*lp, std::move(keep), std::move(on_accept));
          });
          return;
        }
        accept_loop(l, std::move(keep), std::move(on_accept));
      });
}

}  // namespace accelpool::manager
