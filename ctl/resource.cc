#include "ctl/resource.h"

#include "absl/strings/str_cat.h"
#include "ctl/serialize.h"
#include "google/protobuf/descriptor.h"

namespace sdc::sdcctl {

using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;

std::unique_ptr<Resource::Message> Resource::NewList() const {
  return std::unique_ptr<Message>(list_prototype_->New());
}

std::unique_ptr<Resource::Message> Resource::NewItem() const {
  return std::unique_ptr<Message>(item_prototype_->New());
}

grpc::Status Resource::List(AdminClient& admin, const ListFilter& filter, Message* list) const {
  return list_(admin, filter, list);
}

const FieldDescriptor* Resource::ItemsField(const Message& holder) const {
  const FieldDescriptor* f = holder.GetDescriptor()->FindFieldByName(items_field_);
  if (f == nullptr || !f->is_repeated() || f->message_type() != item_prototype_->GetDescriptor()) {
    return nullptr;  // Not a holder of this kind: no items.
  }
  return f;
}

int Resource::Count(const Message& list) const {
  const FieldDescriptor* f = ItemsField(list);
  return f == nullptr ? 0 : list.GetReflection()->FieldSize(list, f);
}

std::string Resource::Name(const Message& item) const { return name_(item); }

Labels Resource::LabelsOf(const Message& item) const {
  Labels out;
  for (const Label& label : labels_) {
    for (std::string& value : label.values(item)) out.emplace_back(label.key, std::move(value));
  }
  return out;
}

absl::Status Resource::CheckSelector(const Selector& selector) const {
  return CheckKeys(selector, label_keys_, plural_);
}

absl::Status Resource::Filter(const Selector& selector, Message* list) const {
  if (absl::Status s = CheckSelector(selector); !s.ok()) return s;
  const FieldDescriptor* f = ItemsField(*list);
  if (f == nullptr || selector.empty()) return absl::OkStatus();
  const Reflection* r = list->GetReflection();
  int kept = 0;
  const int n = r->FieldSize(*list, f);
  for (int i = 0; i < n; ++i) {
    if (!Matches(LabelsOf(r->GetRepeatedMessage(*list, f, i)), selector)) continue;
    // Everything between `kept` and `i` is dropped: the order of the kept
    // items stays.
    if (kept != i) r->SwapElements(list, f, kept, i);
    ++kept;
  }
  for (int i = kept; i < n; ++i) r->RemoveLast(list, f);
  return absl::OkStatus();
}

std::vector<Row> Resource::Rows(const Message& holder, bool wide, absl::string_view name_prefix,
                                absl::Time now) const {
  std::vector<Row> rows;
  Row header = {"NAME"};
  for (const Column& c : columns_) {
    if (wide || !c.wide_only) header.push_back(c.header);
  }
  rows.push_back(std::move(header));
  const FieldDescriptor* f = ItemsField(holder);
  const int n = f == nullptr ? 0 : holder.GetReflection()->FieldSize(holder, f);
  for (int i = 0; i < n; ++i) {
    const Message& item = holder.GetReflection()->GetRepeatedMessage(holder, f, i);
    Row row = {absl::StrCat(name_prefix, Name(item))};
    for (const Column& c : columns_) {
      if (wide || !c.wide_only) row.push_back(c.cell(item, now));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string Resource::NameLines(const Message& holder) const {
  std::string out;
  const FieldDescriptor* f = ItemsField(holder);
  const int n = f == nullptr ? 0 : holder.GetReflection()->FieldSize(holder, f);
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&out, kind_, "/",
                    Name(holder.GetReflection()->GetRepeatedMessage(holder, f, i)), "\n");
  }
  return out;
}

std::string Resource::Format(const Message& list, OutputFormat format, absl::Time now) const {
  switch (format) {
    case OutputFormat::kJson:
      return ToJson(list);
    case OutputFormat::kYaml:
      return ToYaml(list);
    case OutputFormat::kName:
      return NameLines(list);
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  if (Count(list) == 0) return "";
  return RenderTable(Rows(list, format == OutputFormat::kWide, /*name_prefix=*/"", now));
}

grpc::Status Resource::Fetch(AdminClient& admin, const std::string& key, Message* item,
                             Related* related) const {
  grpc::Status status = fetch_(admin, key, item);
  if (status.ok() && related_) status = related_(admin, *item, related);
  return status;
}

std::string Resource::Describe(const Message& item, const Related& related, absl::Time now) const {
  Fields fields;
  for (const auto& add : fields_) {
    for (auto& field : add(item, now)) fields.push_back(std::move(field));
  }
  std::string out = LabelBlock(fields);
  for (const auto& section : sections_) absl::StrAppend(&out, section(item, related, now));
  return out;
}

std::string Resource::FormatOne(const Message& item, const Related& related, OutputFormat format,
                                absl::Time now) const {
  switch (format) {
    case OutputFormat::kJson:
      return ToJson(item);
    case OutputFormat::kYaml:
      return ToYaml(item);
    case OutputFormat::kName:
      return absl::StrCat(kind_, "/", Name(item), "\n");
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  return Describe(item, related, now);
}

}  // namespace sdc::sdcctl
