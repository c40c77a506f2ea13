#include "engine/chat_session.h"

#include <algorithm>

#include "core/error.h"

namespace frink {

using ojson = nlohmann::ordered_json;

ChatSession::ChatSession(Decoder& dec, const Tokenizer& tok, ModelTemplate tmpl, int64_t n_ctx,
                         std::string system_prompt)
    : dec_(dec), tok_(tok), tmpl_(std::move(tmpl)), session_(dec.model(), n_ctx), system_(std::move(system_prompt)) {
  reset();
}

void ChatSession::reset() {
  messages_ = ojson::array();
  if (!system_.empty()) messages_.push_back({{"role", "system"}, {"content", system_}});
  session_.truncate(0);
}

std::vector<int32_t> ChatSession::render_tokens(std::string* warning) const {
  ChatOptions opts;
  opts.add_generation_prompt = true;
  opts.bos_token = tmpl_.bos;
  opts.eos_token = tmpl_.eos;
  const std::string text = render_with_fallback(tmpl_, messages_, ojson(), opts, warning);
  // Templates that print bos_token themselves must not get a second one from the tokenizer.
  const bool template_has_bos = !tmpl_.bos.empty() && text.rfind(tmpl_.bos, 0) == 0;
  return tok_.encode(text, !template_has_bos, true);
}

ChatSession::Turn ChatSession::reply(const std::string& user_text, const GenerateOptions& opts,
                                     const std::function<void(const std::string&)>& on_text,
                                     const std::atomic<bool>* stop) {
  Turn turn;
  messages_.push_back({{"role", "user"}, {"content", user_text}});
  std::vector<int32_t> ids;
  try {
    ids = render_tokens(&turn.warning);
    if (session_.n_ctx() > 0 && static_cast<int64_t>(ids.size()) >= session_.n_ctx())
      fail("the conversation is {} tokens and the context holds {}; /reset to start over", ids.size(), session_.n_ctx());
  } catch (const Error&) {
    messages_.erase(messages_.size() - 1);
    throw;
  }
  // Keep what the cache already holds, but always run at least one token for fresh logits.
  const auto& have = session_.tokens();
  size_t keep = 0;
  while (keep < have.size() && keep < ids.size() && have[keep] == ids[keep]) ++keep;
  keep = std::min(keep, ids.size() - 1);
  // A hybrid model's recurrent state may only go back to a snapshot before `keep`.
  keep = static_cast<size_t>(session_.truncate(static_cast<int64_t>(keep)));
  turn.reused_tokens = static_cast<int64_t>(keep);
  std::vector<int32_t> rest(ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end());
  turn.stats = generate(dec_, session_, tok_, rest, opts,
                        [&](const std::string& piece) {
                          turn.reply += piece;
                          on_text(piece);
                        },
                        stop);
  messages_.push_back({{"role", "assistant"}, {"content", turn.reply}});
  return turn;
}

}  // namespace frink
