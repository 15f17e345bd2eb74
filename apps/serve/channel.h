#pragma once

// The tokens of one request, from the engine's thread (push) to the front door's thread
// that answers it (pop, awaited), and the end of the server's service (abort: shutdown,
// or the engine failed).
//
// pop() waits on a timer of the answering coroutine; push() and abort() wake it by
// posting its cancellation to the door's thread. The timer is the coroutine's: the
// channel holds it only between attach() and detach() (a Waiting guard), so that the
// engine may keep the channel in its callback after the answer and the door are gone.

#include <torchattn/models/engine.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

namespace serve {

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  enum class Pop { Event, Timeout, Aborted };

  /// Holds `timer` as the channel's waker for its lifetime (on the door's thread).
  class Waiting {
   public:
    Waiting(Channel& channel, boost::asio::steady_timer& timer) : channel_(channel) {
      std::lock_guard<std::mutex> lock(channel_.mutex_);
      channel_.timer_ = &timer;
    }
    ~Waiting() {
      std::lock_guard<std::mutex> lock(channel_.mutex_);
      channel_.timer_ = nullptr;
    }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    Channel& channel_;
  };

  void push(const torchattn::models::TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(e);
    wake();
  }

  void abort(int status, std::string message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    status_ = status;
    message_ = std::move(message);
    wake();
  }

  /// The next event (Event), none within `timeout` (Timeout), or the service ended
  /// (Aborted: abort_status() and abort_message() say why). Events come first. Only
  /// between a Waiting's construction and destruction, on the door's thread.
  boost::asio::awaitable<Pop> pop(torchattn::models::TokenEvent& out, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      boost::asio::steady_timer* timer = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!events_.empty()) {
          out = events_.front();
          events_.pop_front();
          co_return Pop::Event;
        }
        if (aborted_) co_return Pop::Aborted;
        timer = timer_;
      }
      if (timer == nullptr || std::chrono::steady_clock::now() >= deadline) co_return Pop::Timeout;
      // A push after the check above posts its wake-up behind this wait: the wait ends.
      timer->expires_at(deadline);
      co_await timer->async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    }
  }

  int abort_status() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }
  std::string abort_message() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return message_;
  }

 private:
  // Under mutex_: the waiting coroutine's timer cancelled on its own thread.
  void wake() {
    if (timer_ == nullptr) return;
    boost::asio::post(timer_->get_executor(), [self = shared_from_this()] {
      std::lock_guard<std::mutex> lock(self->mutex_);
      if (self->timer_ != nullptr) self->timer_->cancel();
    });
  }

  mutable std::mutex mutex_;
  boost::asio::steady_timer* timer_ = nullptr;
  std::deque<torchattn::models::TokenEvent> events_;
  bool aborted_ = false;
  int status_ = 0;
  std::string message_;
};

}  // namespace serve
