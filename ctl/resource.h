#ifndef SDC_CTL_RESOURCE_H_
#define SDC_CTL_RESOURCE_H_

// A kind of thing sdcctl lists and describes (requests, incidents, ...), as
// data: the admin call that lists it, the labels -l matches, the columns of
// its table and of -o wide, the name -o name prints, and how describe
// fetches and shows one. `get`, `describe`, -o, -l and -w are one loop over
// these (ctl/resources.h holds the table); no command switches on a kind.
//
// A Resource is immutable once built and thread-safe. Lists and items are
// passed as google::protobuf::Message: the response type of the list call
// (NewList) and the item type (NewItem); passing any other type is a bug.

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "admin.pb.h"
#include "ctl/admin_client.h"
#include "ctl/argument.h"
#include "ctl/names.h"
#include "ctl/selector.h"
#include "ctl/text.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/status.h"

namespace sdc::sdcctl {

// The server-side filters of list calls, from get's flags.
struct ListFilter {
  v1::RequestState state = v1::REQUEST_STATE_UNSPECIFIED;  // get requests --state.
  std::string job;                                         // get incidents --job.
};

// What a description shows beside the item itself, fetched with it.
struct Related {
  v1::ListRanksResponse ranks;          // describe job: the job's ranks.
  v1::ListIncidentsResponse incidents;  // describe job: the job's incidents.
};

template <typename List, typename T>
class ResourceBuilder;

class Resource {
 public:
  using Message = google::protobuf::Message;

  // "request": describe's word and -o name's "request/7".
  const std::string& kind() const { return kind_; }
  // "requests": get's word.
  const std::string& plural() const { return plural_; }
  // One line each for help: what get lists, what describe shows ("" none).
  const std::string& list_summary() const { return list_summary_; }
  const std::string& describe_summary() const { return describe_summary_; }

  // ---- get

  // The get flags whose ListFilter field the list call reads ("state").
  const std::vector<std::string>& list_flags() const { return list_flags_; }
  // An empty list (the list call's response type).
  std::unique_ptr<Message> NewList() const;
  // The list call.
  grpc::Status List(AdminClient& admin, const ListFilter& filter, Message* list) const;
  // The label keys -l may name, in the order help shows them.
  const std::vector<std::string>& label_keys() const { return label_keys_; }
  // InvalidArgument naming the resource's labels when the selector names a
  // key it lacks.
  absl::Status CheckSelector(const Selector& selector) const;
  // Keeps the items of `list` that match, in order. InvalidArgument (list
  // untouched) as CheckSelector.
  absl::Status Filter(const Selector& selector, Message* list) const;
  // How many items `list` holds.
  int Count(const Message& list) const;
  // The list in `format`. Table and wide: a header in capitals, NAME first,
  // columns aligned and separated by at least three spaces; "" when empty
  // (the caller says "No resources found." on stderr). Name: "kind/NAME" per
  // item. Json and yaml: the whole response, the empty document included.
  // Every non-empty result ends with a newline.
  std::string Format(const Message& list, OutputFormat format, absl::Time now) const;
  // The table of the items in `holder`'s repeated field named as the list
  // response's (a HistoryResponse holds "incidents" and "requests"): the
  // header row, then one row per item, NAME prefixed with `name_prefix`.
  std::vector<Row> Rows(const Message& holder, bool wide, absl::string_view name_prefix,
                        absl::Time now) const;
  // "kind/NAME" per item of that field, one per line.
  std::string NameLines(const Message& holder) const;
  // An item's NAME (an id, a node's name, ...).
  std::string Name(const Message& item) const;

  // ---- describe

  // False for kinds describe does not take (suspects, operators).
  bool describable() const { return static_cast<bool>(fetch_); }
  // What names one item: "ID" (a positive integer) or "NAME". REQUIRES:
  // describable().
  const Argument& key() const { return key_; }
  // An empty item.
  std::unique_ptr<Message> NewItem() const;
  // The item `key` names, and what its description shows beside it. The
  // calls' status: NOT_FOUND when there is no such item. REQUIRES:
  // describable(), `key` parsed by key().
  grpc::Status Fetch(AdminClient& admin, const std::string& key, Message* item,
                     Related* related) const;
  // kubectl describe's layout: the "Label:  value" fields, then the sections
  // (nested tables, lists of incidents). Times are UTC with their age at
  // `now`.
  std::string Describe(const Message& item, const Related& related, absl::Time now) const;
  // One item in `format`: Describe for table and wide, "kind/NAME" for name,
  // the item alone for json and yaml. Ends with a newline.
  std::string FormatOne(const Message& item, const Related& related, OutputFormat format,
                        absl::Time now) const;

 private:
  template <typename List, typename T>
  friend class ResourceBuilder;

  struct Column {
    std::string header;
    bool wide_only;
    std::function<std::string(const Message&, absl::Time)> cell;
  };
  struct Label {
    std::string key;
    std::function<std::vector<std::string>(const Message&)> values;
  };

  Labels LabelsOf(const Message& item) const;
  // The repeated field of `holder` that holds this kind's items.
  const google::protobuf::FieldDescriptor* ItemsField(const Message& holder) const;

  std::string kind_;
  std::string plural_;
  std::string items_field_;
  std::string list_summary_;
  std::string describe_summary_;
  const Message* list_prototype_ = nullptr;
  const Message* item_prototype_ = nullptr;
  std::function<grpc::Status(AdminClient&, const ListFilter&, Message*)> list_;
  std::vector<std::string> list_flags_;
  std::function<std::string(const Message&)> name_;
  std::vector<Column> columns_;
  std::vector<std::string> label_keys_;
  std::vector<Label> labels_;
  Argument key_;
  std::function<grpc::Status(AdminClient&, const std::string&, Message*)> fetch_;
  std::function<grpc::Status(AdminClient&, const Message&, Related*)> related_;
  std::vector<std::function<Fields(const Message&, absl::Time)>> fields_;
  std::vector<std::function<std::string(const Message&, const Related&, absl::Time)>> sections_;
};

// Writes one entry of the table of resources (ctl/resources.cc) in terms of
// its typed messages: `List` is the list call's response, `T` the item. Each
// method takes a callable on `const T&` and returns the builder, so that an
// entry reads as a table:
//
//   ResourceBuilder<v1::ListJobsResponse, v1::Job>("job", "jobs", "jobs")
//       .ListedBy([](AdminClient& admin, const ListFilter&, v1::ListJobsResponse* r) {...})
//       .Named([](const v1::Job& j) { return Cell(j.job_id()); })
//       .Column("WORLD", [](const v1::Job& j) { return absl::StrCat(j.world_size()); })
//       ...
//       .Build();
template <typename List, typename T>
class ResourceBuilder {
 public:
  using Message = google::protobuf::Message;

  // `items_field`: the repeated field of List that holds the items.
  ResourceBuilder(std::string kind, std::string plural, std::string items_field) {
    r_.kind_ = std::move(kind);
    r_.plural_ = std::move(plural);
    r_.items_field_ = std::move(items_field);
    r_.list_prototype_ = &List::default_instance();
    r_.item_prototype_ = &T::default_instance();
  }

  ResourceBuilder& Summaries(std::string list, std::string describe = "") {
    r_.list_summary_ = std::move(list);
    r_.describe_summary_ = std::move(describe);
    return *this;
  }

  // call(AdminClient&, const ListFilter&, List*) -> grpc::Status; `flags`:
  // the get flags it reads.
  template <typename F>
  ResourceBuilder& ListedBy(F call, std::vector<std::string> flags = {}) {
    r_.list_ = [call](AdminClient& admin, const ListFilter& filter, Message* list) {
      return call(admin, filter, static_cast<List*>(list));
    };
    r_.list_flags_ = std::move(flags);
    return *this;
  }

  // name(const T&) -> std::string: NAME, and -o name's "kind/NAME".
  template <typename F>
  ResourceBuilder& Named(F name) {
    r_.name_ = [name](const Message& m) { return std::string(name(Of(m))); };
    return *this;
  }

  // cell(const T&) or cell(const T&, absl::Time now) -> std::string: a column
  // of the table and of -o wide, after NAME and the columns before it.
  template <typename F>
  ResourceBuilder& Column(std::string header, F cell) {
    r_.columns_.push_back({std::move(header), /*wide_only=*/false, AtTime<std::string>(cell)});
    return *this;
  }

  // A column of -o wide only.
  template <typename F>
  ResourceBuilder& WideColumn(std::string header, F cell) {
    r_.columns_.push_back({std::move(header), /*wide_only=*/true, AtTime<std::string>(cell)});
    return *this;
  }

  // values(const T&) -> a string, or strings (an item matches key=v when any
  // of its values is v).
  template <typename F>
  ResourceBuilder& Label(std::string key, F values) {
    r_.label_keys_.push_back(key);
    r_.labels_.push_back(
        {std::move(key), [values](const Message& m) {
           std::vector<std::string> out;
           if constexpr (std::is_convertible_v<std::invoke_result_t<F, const T&>, std::string>) {
             out.push_back(values(Of(m)));
           } else {
             for (const auto& v : values(Of(m))) out.push_back(std::string(v));
           }
           return out;
         }});
    return *this;
  }

  // describe takes this kind: `key` names one item; fetch(AdminClient&, const
  // std::string& key, T*) -> grpc::Status (NOT_FOUND when none).
  template <typename F>
  ResourceBuilder& DescribedBy(Argument key, F fetch) {
    r_.key_ = std::move(key);
    r_.fetch_ = [fetch](AdminClient& admin, const std::string& value, Message* item) {
      return fetch(admin, value, static_cast<T*>(item));
    };
    return *this;
  }

  // related(AdminClient&, const T&, Related*) -> grpc::Status: what the
  // description shows beside the item, fetched after it.
  template <typename F>
  ResourceBuilder& WithRelated(F related) {
    r_.related_ = [related](AdminClient& admin, const Message& item, Related* out) {
      return related(admin, Of(item), out);
    };
    return *this;
  }

  // value(const T&) or value(const T&, absl::Time now) -> std::string: one
  // "Label:  value" line of the description's first block.
  template <typename F>
  ResourceBuilder& Field(std::string label, F value) {
    auto text = AtTime<std::string>(value);
    r_.fields_.push_back([label = std::move(label), text](const Message& m, absl::Time now) {
      return Fields{{label, text(m, now)}};
    });
    return *this;
  }

  // fields(const T&, absl::Time now) -> Fields: several lines of that block
  // (a list shared with another description).
  template <typename F>
  ResourceBuilder& FieldList(F fields) {
    r_.fields_.push_back(AtTime<Fields>(fields));
    return *this;
  }

  // section(const T&, [const Related&,] absl::Time now) -> std::string: text
  // after the fields (a nested table, a list), in the order added.
  template <typename F>
  ResourceBuilder& Section(F section) {
    r_.sections_.push_back([section](const Message& m, const Related& related, absl::Time now) {
      if constexpr (std::is_invocable_v<F, const T&, const Related&, absl::Time>) {
        return std::string(section(Of(m), related, now));
      } else {
        return std::string(section(Of(m), now));
      }
    });
    return *this;
  }

  Resource Build() { return std::move(r_); }

 private:
  static const T& Of(const Message& m) { return static_cast<const T&>(m); }

  // f(const T&) or f(const T&, absl::Time) as a function of both.
  template <typename R, typename F>
  static std::function<R(const Message&, absl::Time)> AtTime(F f) {
    return [f](const Message& m, absl::Time now) -> R {
      if constexpr (std::is_invocable_v<F, const T&, absl::Time>) {
        return f(Of(m), now);
      } else {
        return f(Of(m));
      }
    };
  }

  Resource r_;
};

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_RESOURCE_H_
