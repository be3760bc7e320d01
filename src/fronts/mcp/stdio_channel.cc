#include "fronts/mcp/stdio_channel.h"

#include <fcntl.h>
#include <unistd.h>

namespace idem::mcp {
namespace {

// The answer to a message over the limit, which was never held whole.
std::string OversizeAnswer(std::string_view id_text, size_t limit) {
  return ErrorResponse(id_text, kRpcInvalidRequest,
                       "Invalid Request: the message is larger than the limit of " +
                           std::to_string(limit) +
                           " bytes (limits.max_body_bytes); it was dropped unread and nothing in "
                           "it was executed: send smaller arguments, or raise the limit");
}

}  // namespace

StdioChannel::StdioChannel(StdioOptions options) : options_(options) {
  int out = ::fcntl(options_.out_fd, F_DUPFD_CLOEXEC, 3);
  if (out >= 0 && options_.protect_stdout && options_.out_fd == STDOUT_FILENO) {
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
  }
  writer_ = std::make_unique<FdWriter>(out);
}

StdioChannel::~StdioChannel() {
  wake_.Wake();
  if (reader_.joinable()) reader_.join();
  writer_->AwaitClosed(std::chrono::seconds(2));
  writer_.reset();
}

void StdioChannel::Start(std::function<void(std::string message)> on_message,
                         std::function<void(std::string reason)> on_closed) {
  reader_ =
      std::thread([this, on_message = std::move(on_message), on_closed = std::move(on_closed)] {
        LineFramer framer(options_.max_message_bytes);
        auto on_frame = [&](LineFramer::Frame frame) {
          if (frame.oversize) {
            Send(OversizeAnswer(frame.id_text, framer.max_message_bytes()));
            return;
          }
          on_message(std::move(frame.message));
        };
        std::string error;
        switch (ReadFrames(options_.in_fd, wake_.read_fd(), framer, on_frame, &error)) {
          case ReadEnd::kEof:
            on_closed("client closed stdin");
            break;
          case ReadEnd::kError:
            on_closed("cannot read stdin: " + error);
            break;
          case ReadEnd::kWoken:
            break;  // the channel is being destroyed
        }
      });
}

bool StdioChannel::Send(std::string message) {
  return writer_->Send(FrameLine(std::move(message)));
}

void StdioChannel::Close() { writer_->Close(); }

}  // namespace idem::mcp
